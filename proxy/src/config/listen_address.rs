//! A listener's addresses: its `address` and its `additional_addresses`, each bound to its own
//! sockets, all feeding the listener's filter chains (Envoy's dual-stack listeners, such as
//! istiod's `0.0.0.0:15001` with `[::]:15001`). The listener is named once, by its `address`,
//! in stats and admin.

use std::net::SocketAddr;

use proto::pb::envoy::config::core::v3::{Address, address, socket_address};
use proto::pb::envoy::config::listener::v3::Listener;

use super::listener::socket_addr;
use super::{ConfigError, Warnings};

/// One address a listener binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ListenAddress {
    /// The IP and port.
    pub address: SocketAddr,
    /// `socket_address.ipv4_compat`: an IPv6 socket that takes IPv4 connections too
    /// (`IPV6_V6ONLY` off). Without it an IPv6 socket takes IPv6 only, as in Envoy, so
    /// `0.0.0.0:P` and `[::]:P` can be bound side by side.
    pub ipv4_compat: bool,
}

impl ListenAddress {
    /// Whether a socket bound for `self` serves `other` too: the same IP and port. A change of
    /// `ipv4_compat` alone keeps the socket as it was bound, as Envoy keeps a listener's socket
    /// when its address compares equal.
    pub fn same_socket(&self, other: &ListenAddress) -> bool {
        self.address == other.address
    }
}

/// The listener's `address` and its `additional_addresses`, in configuration order, checked as
/// Envoy checks them (same socket type, `ipv4_compat` only where Envoy allows it).
pub fn compile_addresses(
    l: &Listener,
    warnings: &mut Warnings,
) -> Result<(ListenAddress, Vec<ListenAddress>), ConfigError> {
    let main = socket_addr(l.address.as_ref(), "address")?;
    check_ipv4_compat(main, l.address.as_ref(), "address")?;
    let main = ListenAddress {
        address: main,
        ipv4_compat: ipv4_compat(l.address.as_ref()),
    };
    let additional = l
        .additional_addresses
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let path = format!("additional_addresses[{i}].address");
            if is_udp(a.address.as_ref()) {
                return Err(ConfigError::new(
                    format!("{path}.socket_address.protocol"),
                    format!(
                        "listener {}: has different socket type. The listener only support same socket type for all the addresses.",
                        l.name
                    ),
                ));
            }
            let address = socket_addr(a.address.as_ref(), &path)?;
            // Envoy checks an additional address's `ipv4_compat` against the listener's
            // `address` (not the additional one), and names that address in its error.
            check_ipv4_compat(main.address, a.address.as_ref(), &path)?;
            if a.socket_options.is_some() {
                warnings.skipped(
                    format!("additional_addresses[{i}].socket_options"),
                    "listener socket options are not applied by revoy",
                );
            }
            Ok(ListenAddress {
                address,
                ipv4_compat: ipv4_compat(a.address.as_ref()),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((main, additional))
}

/// Whether `a` is a UDP socket address.
pub fn is_udp(a: Option<&Address>) -> bool {
    matches!(
        a.and_then(|a| a.address.as_ref()),
        Some(address::Address::SocketAddress(sa)) if sa.protocol == socket_address::Protocol::Udp as i32
    )
}

fn ipv4_compat(a: Option<&Address>) -> bool {
    matches!(
        a.and_then(|a| a.address.as_ref()),
        Some(address::Address::SocketAddress(sa)) if sa.ipv4_compat
    )
}

/// Envoy's rule: `ipv4_compat` (set in `proto`) is allowed only when `checked` is the IPv6
/// any address or an IPv4-mapped IPv6 address.
fn check_ipv4_compat(
    checked: SocketAddr,
    proto: Option<&Address>,
    path: &str,
) -> Result<(), ConfigError> {
    let allowed = match checked {
        SocketAddr::V4(_) => false,
        SocketAddr::V6(a) => a.ip().is_unspecified() || a.ip().to_ipv4_mapped().is_some(),
    };
    if ipv4_compat(proto) && !allowed {
        return Err(ConfigError::new(
            format!("{path}.socket_address.ipv4_compat"),
            format!(
                "Only IPv6 address '::' or valid IPv4-mapped IPv6 address can set ipv4_compat: {checked}"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(yaml: &str) -> Listener {
        let value = proto::Codec::parse_text(yaml, proto::Format::Yaml).unwrap();
        proto::Codec::new().decode(value, false).unwrap().message
    }

    fn compile(address: &str, additional: &str) -> Result<Vec<ListenAddress>, ConfigError> {
        let l = decode(&format!(
            "name: l\naddress: {{socket_address: {address}}}\nadditional_addresses: [{additional}]"
        ));
        let (main, rest) = compile_addresses(&l, &mut Warnings::new())?;
        Ok(std::iter::once(main).chain(rest).collect())
    }

    #[test]
    fn additional_addresses_follow_the_main_one_in_order() {
        let got = compile(
            "{address: 0.0.0.0, port_value: 15001}",
            "{address: {socket_address: {address: '::', port_value: 15001}}}, {address: {socket_address: {address: '::1', port_value: 0}}}",
        )
        .unwrap();
        let want = ["0.0.0.0:15001", "[::]:15001", "[::1]:0"];
        let got: Vec<_> = got.iter().map(|a| a.address.to_string()).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn ipv4_compat_is_checked_as_envoy_checks_it() {
        let compat = |main: &str, extra: &str| {
            compile(
                &format!("{{address: '{main}', port_value: 15001}}"),
                &format!(
                    "{{address: {{socket_address: {{address: '{extra}', port_value: 15002, ipv4_compat: true}}}}}}"
                ),
            )
        };
        // Envoy's check reads the listener's `address`, whatever the additional one is.
        let e = compat("0.0.0.0", "::").unwrap_err();
        assert_eq!(
            e.path,
            "additional_addresses[0].address.socket_address.ipv4_compat"
        );
        assert!(
            e.to_string().contains(
                "Only IPv6 address '::' or valid IPv4-mapped IPv6 address can set ipv4_compat: 0.0.0.0:15001"
            ),
            "{e}"
        );
        let got = compat("::", "::1").unwrap();
        assert!(!got[0].ipv4_compat && got[1].ipv4_compat);
        assert!(compat("::ffff:127.0.0.1", "::1").is_ok());
        let e = compile("{address: '::1', port_value: 1, ipv4_compat: true}", "").unwrap_err();
        assert!(e.to_string().contains("ipv4_compat: [::1]:1"), "{e}");
    }

    #[test]
    fn a_udp_additional_address_is_a_different_socket_type() {
        let e = compile(
            "{address: 127.0.0.1, port_value: 1}",
            "{address: {socket_address: {address: '::1', port_value: 1, protocol: UDP}}}",
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("listener l: has different socket type"),
            "{e}"
        );
    }

    #[test]
    fn additional_socket_options_are_named_as_skipped() {
        let l = decode(
            "name: l\naddress: {socket_address: {address: 127.0.0.1, port_value: 1}}\nadditional_addresses: [{address: {socket_address: {address: '::1', port_value: 1}}, socket_options: {}}]",
        );
        let mut warnings = Warnings::new();
        compile_addresses(&l, &mut warnings).unwrap();
        let paths: Vec<&str> = warnings.iter().map(|w| w.path.as_str()).collect();
        assert_eq!(paths, ["additional_addresses[0].socket_options"]);
    }
}
