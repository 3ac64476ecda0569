set -eu
days=36500
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key"; }
ca() { # name, subject
  key "$1"
  openssl req -x509 -new -key "$1.key" -subj "/CN=$2" -days $days -sha256 \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    -out "$1.pem"
}
intermediate() { # name, subject, issuing CA
  key "$1"
  openssl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr"
  printf '%s\n' "basicConstraints=critical,CA:TRUE" "keyUsage=critical,keyCertSign,cRLSign" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$3.pem" -CAkey "$3.key" -set_serial "0x$(openssl rand -hex 8)" \
    -days $days -sha256 -extfile "$1.ext" -out "$1.pem"
  rm "$1.csr" "$1.ext"
}
leaf() { # name, subject, issuing CA, extensions
  key "$1"
  openssl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr"
  printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" "$4" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$3.pem" -CAkey "$3.key" -set_serial "0x$(openssl rand -hex 8)" \
    -days $days -sha256 -extfile "$1.ext" -out "$1.pem"
  rm "$1.csr" "$1.ext"
}
ca ca "revoy test CA"
ca other-ca "revoy other test CA"
leaf server server.test ca "extendedKeyUsage=serverAuth
subjectAltName=DNS:server.test"
leaf client client ca "extendedKeyUsage=clientAuth"
leaf other-client other-client other-ca "extendedKeyUsage=clientAuth"
# A client certificate issued by an intermediate CA that the trusted CA signed; its .pem holds
# the chain the client presents (the leaf, then the intermediate).
intermediate intermediate-ca "revoy test intermediate CA" ca
leaf chained-client chained-client intermediate-ca "extendedKeyUsage=clientAuth"
cat intermediate-ca.pem >> chained-client.pem
# Expired: valid from 2000-01-01 to 2001-01-01, signed by the trusted CA (openssl ca sets both dates).
key expired-client
openssl req -new -key expired-client.key -subj "/CN=expired-client" -out expired-client.csr
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
x509_extensions = client
[anything]
commonName = supplied
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
CNF
openssl rand -hex 8 > ca-db/serial
openssl ca -batch -config ca-db/ca.cnf -cert ca.pem -keyfile ca.key -in expired-client.csr \
  -startdate 20000101000000Z -enddate 20010101000000Z -notext -out expired-client.pem
rm -r ca-db expired-client.csr
