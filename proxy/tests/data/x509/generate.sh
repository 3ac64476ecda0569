# Writes names.pem (and names.key): a self-signed certificate whose subject and subjectAltName
# exercise the formats revoy's tls::x509 must write as Envoy does (RFC 2253 escapes, a
# multi-valued RDN, UTF-8, an attribute type BoringSSL has no name for, every SAN kind), with
# fixed dates (one UTCTime, one GeneralizedTime) and a fixed serial number.
set -eu
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out names.key
openssl req -new -key names.key -utf8 -multivalue-rdn \
  -subj '/C=US/ST=Île-de-France/O=Sue, Grabbit and Runn/O=a\+b <c>; "d" \\e/OU=#hash+CN= spaced /organizationIdentifier=VATFR-123/emailAddress=ops@names.test' \
  -out names.csr
mkdir -p ca-db && : > ca-db/index.txt
cat > ca-db/ca.cnf <<CNF
[ca]
default_ca = test
[test]
database = ca-db/index.txt
new_certs_dir = ca-db
serial = ca-db/serial
default_md = sha256
policy = anything
x509_extensions = leaf
preserve = yes
unique_subject = no
[anything]
[leaf]
basicConstraints = critical,CA:FALSE
subjectAltName = DNS:a.names.test,URI:spiffe://cluster.local/ns/default/sa/names,IP:127.0.0.1,email:ops@names.test,IP:2001:db8::1,IP:::ffff:192.0.2.7,IP:::192.0.2.8,DNS:*.names.test
CNF
echo 0A0B0C > ca-db/serial
openssl ca -batch -config ca-db/ca.cnf -selfsign -keyfile names.key -in names.csr -utf8 \
  -multivalue-rdn -preserveDN -startdate 20240102030405Z -enddate 20510607080910Z -notext \
  -out names.pem
rm -r ca-db names.csr
