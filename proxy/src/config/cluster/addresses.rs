//! The addresses of a connection beyond an endpoint's own: an endpoint's
//! `additional_addresses` and the order Happy Eyeballs tries them in
//! (`upstream_connection_options.happy_eyeballs_config`), and the source address a connection
//! leaves from (`upstream_bind_config`), with Envoy 1.40's rules and error texts.

use std::net::{IpAddr, SocketAddr};

use proto::pb::envoy::config::cluster::v3::Cluster;
use proto::pb::envoy::config::cluster::v3::upstream_connection_options::FirstAddressFamilyVersion;
use proto::pb::envoy::config::core::v3 as core;
use proto::pb::envoy::config::endpoint::v3::Endpoint;

use super::super::ConfigError;

/// `upstream_bind_config`'s source addresses. A connection to a host leaves from the one of
/// the host's IP version; when neither is, from `source_address`, as in Envoy, whose bind
/// then fails (a local connection failure).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SourceAddresses {
    /// `source_address`.
    pub first: Option<SocketAddr>,
    /// `extra_source_addresses[0]` (or the deprecated `additional_source_addresses[0]`), of
    /// the other IP version.
    pub other: Option<SocketAddr>,
}

impl SourceAddresses {
    /// No source address: the system picks one.
    pub const NONE: SourceAddresses = SourceAddresses {
        first: None,
        other: None,
    };

    /// The address a connection to `host` binds to, if any.
    pub fn for_host(&self, host: SocketAddr) -> Option<SocketAddr> {
        match self.other {
            Some(other) if other.is_ipv4() == host.is_ipv4() => Some(other),
            _ => self.first,
        }
    }

    /// The cluster's source addresses: its own `upstream_bind_config` when it has one (even
    /// one without `source_address`: it replaces the bootstrap's whole, as in Envoy), else
    /// `bootstrap`, the bootstrap's `cluster_manager.upstream_bind_config` (see
    /// [`SourceAddresses::compile_bind`]). Paths are relative to the cluster.
    pub fn compile(
        c: &Cluster,
        bootstrap: SourceAddresses,
    ) -> Result<SourceAddresses, ConfigError> {
        match &c.upstream_bind_config {
            Some(bind) => Self::compile_bind(bind, &format!("Cluster {}", c.name))
                .map_err(|e| e.within("upstream_bind_config")),
            None => Ok(bootstrap),
        }
    }

    /// Compiles a `BindConfig`'s source addresses with Envoy's checks and error texts, which
    /// name the config as `whose` (`Cluster <name>`, or `Bootstrap` for the bootstrap's
    /// `cluster_manager.upstream_bind_config`). Paths are relative to the `BindConfig`.
    #[allow(deprecated)] // additional_source_addresses is still accepted by Envoy.
    pub fn compile_bind(
        bind: &core::BindConfig,
        whose: &str,
    ) -> Result<SourceAddresses, ConfigError> {
        if !bind.extra_source_addresses.is_empty() && !bind.additional_source_addresses.is_empty() {
            return Err(ConfigError::new(
                "",
                format!(
                    "Can't specify both `extra_source_addresses` and `additional_source_addresses` in the {whose}'s upstream binding config"
                ),
            ));
        }
        if bind.extra_source_addresses.len() > 1 || bind.additional_source_addresses.len() > 1 {
            return Err(ConfigError::new(
                "",
                format!(
                    "{whose}'s upstream binding config has more than one extra/additional source addresses. Only one extra/additional source can be supported in BindConfig's extra_source_addresses/additional_source_addresses field"
                ),
            ));
        }
        let first = match &bind.source_address {
            Some(sa) => Some(super::socket_address(sa).map_err(|e| e.within("source_address"))?),
            None => None,
        };
        let (other, at) = match (
            bind.extra_source_addresses.first(),
            bind.additional_source_addresses.first(),
        ) {
            (Some(extra), _) => (extra.address.as_ref(), "extra_source_addresses[0].address"),
            (None, Some(additional)) => (Some(additional), "additional_source_addresses[0]"),
            (None, None) => return Ok(SourceAddresses { first, other: None }),
        };
        let Some(first) = first else {
            return Err(ConfigError::new(
                "",
                format!(
                    "{whose}'s upstream binding config has extra/additional source addresses but no source_address. Extra/additional addresses cannot be specified if source_address is not set."
                ),
            ));
        };
        let other = other.ok_or_else(|| ConfigError::new(at, "value is required"))?;
        let other = super::socket_address(other).map_err(|e| e.within(at))?;
        if other.is_ipv4() == first.is_ipv4() {
            return Err(ConfigError::new(
                at,
                format!(
                    "{whose}'s upstream binding config has two same IP version source addresses. Only two different IP version source addresses can be supported in BindConfig's source_address and extra_source_addresses/additional_source_addresses fields"
                ),
            ));
        }
        Ok(SourceAddresses {
            first: Some(first),
            other: Some(other),
        })
    }

    /// Whether `bind` sets what revoy does not apply (`freebind`, `socket_options`, an extra
    /// source address's own socket options, `local_address_selector`).
    pub fn has_unapplied(bind: &core::BindConfig) -> bool {
        bind.freebind.is_some_and(|f| f.value)
            || !bind.socket_options.is_empty()
            || bind
                .extra_source_addresses
                .iter()
                .any(|e| e.socket_options.is_some())
            || bind.local_address_selector.is_some()
    }

    /// What [`SourceAddresses::has_unapplied`] finds, as a skipped feature's message.
    pub const UNAPPLIED: &str = "only its source addresses (source_address, extra_source_addresses, additional_source_addresses) are applied by revoy; freebind, socket_options and local_address_selector are not";
}

/// The bootstrap's `cluster_manager.upstream_bind_config`, compiled: the source addresses of
/// the clusters without an `upstream_bind_config` of their own, or, when Envoy refuses it,
/// its error (path from the document root). Envoy refuses only the clusters that use a bad
/// one, so a cluster with its own bind config is still accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootstrapBind(Result<SourceAddresses, ConfigError>);

impl Default for BootstrapBind {
    fn default() -> Self {
        BootstrapBind(Ok(SourceAddresses::NONE))
    }
}

impl BootstrapBind {
    /// Where it sits in the bootstrap.
    pub const PATH: &str = "cluster_manager.upstream_bind_config";

    /// Compiles the bootstrap's bind config (`None`: it has none).
    pub fn compile(bind: Option<&core::BindConfig>) -> BootstrapBind {
        BootstrapBind(match bind {
            Some(bind) => {
                SourceAddresses::compile_bind(bind, "Bootstrap").map_err(|e| e.within(Self::PATH))
            }
            None => Ok(SourceAddresses::NONE),
        })
    }

    /// The source addresses cluster `c` falls back on (what
    /// [`super::compile_cluster`] takes): the bootstrap's, or its error when `c` has no bind
    /// config of its own to use instead.
    pub fn fallback(&self, c: &Cluster) -> Result<SourceAddresses, ConfigError> {
        match (&self.0, &c.upstream_bind_config) {
            (Ok(source), _) => Ok(*source),
            (Err(_), Some(_)) => Ok(SourceAddresses::NONE),
            (Err(e), None) => Err(e.clone()),
        }
    }
}

/// The address family tried first among an endpoint's addresses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FirstFamily {
    /// The family of the endpoint's `address` (`DEFAULT`).
    #[default]
    OfFirstAddress,
    /// IPv4.
    V4,
    /// IPv6.
    V6,
    /// `PIPE` or `INTERNAL`: none of an IP endpoint's, so the families take turns in the
    /// order they first appear.
    Neither,
}

/// `upstream_connection_options.happy_eyeballs_config`: the order an endpoint's addresses are
/// tried in (RFC 8305 section 4, as Envoy sorts them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HappyEyeballs {
    /// `first_address_family_version`.
    pub first_family: FirstFamily,
    /// `first_address_family_count` (default 1): addresses of the first family tried before
    /// each turn of the other.
    pub first_count: u32,
}

impl Default for HappyEyeballs {
    fn default() -> Self {
        HappyEyeballs {
            first_family: FirstFamily::OfFirstAddress,
            first_count: 1,
        }
    }
}

impl HappyEyeballs {
    /// Compiles the cluster's `upstream_connection_options.happy_eyeballs_config`.
    pub fn compile(c: &Cluster) -> Result<HappyEyeballs, ConfigError> {
        let Some(he) = c
            .upstream_connection_options
            .as_ref()
            .and_then(|o| o.happy_eyeballs_config.as_ref())
        else {
            return Ok(HappyEyeballs::default());
        };
        let first_family = match FirstAddressFamilyVersion::try_from(
            he.first_address_family_version,
        ) {
            Ok(FirstAddressFamilyVersion::Default) => FirstFamily::OfFirstAddress,
            Ok(FirstAddressFamilyVersion::V4) => FirstFamily::V4,
            Ok(FirstAddressFamilyVersion::V6) => FirstFamily::V6,
            Ok(FirstAddressFamilyVersion::Pipe | FirstAddressFamilyVersion::Internal) => {
                FirstFamily::Neither
            }
            Err(_) => {
                return Err(ConfigError::new(
                    "upstream_connection_options.happy_eyeballs_config.first_address_family_version",
                    "value must be one of the defined enum values",
                ));
            }
        };
        let first_count = match he.first_address_family_count {
            Some(n) if n.value == 0 => {
                return Err(ConfigError::new(
                    "upstream_connection_options.happy_eyeballs_config.first_address_family_count",
                    "value must be greater than or equal to 1",
                ));
            }
            Some(n) => n.value,
            None => 1,
        };
        Ok(HappyEyeballs {
            first_family,
            first_count,
        })
    }

    /// `addresses` (the endpoint's `address`, then its additional ones) in the order they are
    /// tried: the families take turns, the first family (`first_count` addresses a turn)
    /// leading, each family's addresses in their own order.
    pub fn order(&self, addresses: &[SocketAddr]) -> Vec<SocketAddr> {
        let Some(&head) = addresses.first() else {
            return Vec::new();
        };
        let lead_v4 = match self.first_family {
            FirstFamily::OfFirstAddress => Some(head.is_ipv4()),
            FirstFamily::V4 => Some(true),
            FirstFamily::V6 => Some(false),
            FirstFamily::Neither => None,
        };
        // The families in the order of their first address, the leading one (if present) first.
        let first_v4 = match lead_v4 {
            Some(v4) if addresses.iter().any(|a| a.is_ipv4() == v4) => v4,
            _ => head.is_ipv4(),
        };
        let family = |v4: bool| {
            addresses
                .iter()
                .filter(move |a: &&SocketAddr| a.is_ipv4() == v4)
        };
        let mut turns = [family(first_v4), family(!first_v4)];
        let per_turn = [
            if lead_v4 == Some(first_v4) {
                self.first_count
            } else {
                1
            },
            1,
        ];
        let mut out = Vec::with_capacity(addresses.len());
        while out.len() < addresses.len() {
            for (family, n) in turns.iter_mut().zip(per_turn) {
                out.extend(family.by_ref().take(n as usize).copied());
            }
        }
        out
    }
}

/// An endpoint's `additional_addresses` (IP socket addresses, as Envoy requires of STATIC and
/// EDS endpoints; paths relative to the endpoint).
pub fn additional_addresses(ep: &Endpoint) -> Result<Box<[SocketAddr]>, ConfigError> {
    ep.additional_addresses
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let at = format!("additional_addresses[{i}].address");
            match a.address.as_ref().and_then(|a| a.address.as_ref()) {
                Some(core::address::Address::SocketAddress(sa)) => {
                    let ip: IpAddr = sa.address.parse().map_err(|_| {
                        ConfigError::new(
                            format!("{at}.socket_address.address"),
                            format!(
                                "malformed IP address: {}. Consider setting resolver_name or setting cluster type to 'STRICT_DNS' or 'LOGICAL_DNS'",
                                sa.address
                            ),
                        )
                    })?;
                    Ok(SocketAddr::new(ip, super::port(sa).map_err(|e| e.within(&at))?))
                }
                Some(_) => Err(ConfigError::new(
                    at,
                    "an additional address that is not an IP socket address (a pipe, an internal listener) is not implemented by revoy",
                )),
                None => Err(ConfigError::new(at, "Address must be set")),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Addresses are only ordered here, never connected to: loopback ones, told apart by
    /// port within a family.
    fn addrs(list: &[&str]) -> Vec<SocketAddr> {
        list.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn families_take_turns_led_by_the_first_address() {
        let he = HappyEyeballs::default();
        let input = addrs(&[
            "127.0.0.1:1",
            "127.0.0.2:1",
            "[::1]:1",
            "[::1]:2",
            "127.0.0.3:1",
        ]);
        assert_eq!(
            he.order(&input),
            addrs(&[
                "127.0.0.1:1",
                "[::1]:1",
                "127.0.0.2:1",
                "[::1]:2",
                "127.0.0.3:1"
            ])
        );
        let one = addrs(&["[::1]:1"]);
        assert_eq!(he.order(&one), one);
    }

    #[test]
    fn a_first_family_and_count_reorder_as_envoy() {
        let input = addrs(&[
            "127.0.0.1:1",
            "127.0.0.2:1",
            "[::1]:1",
            "[::1]:2",
            "[::1]:3",
        ]);
        let v6_twice = HappyEyeballs {
            first_family: FirstFamily::V6,
            first_count: 2,
        };
        assert_eq!(
            v6_twice.order(&input),
            addrs(&[
                "[::1]:1",
                "[::1]:2",
                "127.0.0.1:1",
                "[::1]:3",
                "127.0.0.2:1"
            ])
        );
        let absent = HappyEyeballs {
            first_family: FirstFamily::V6,
            first_count: 3,
        };
        let v4 = addrs(&["127.0.0.1:1", "127.0.0.2:1"]);
        assert_eq!(absent.order(&v4), v4);
        let neither = HappyEyeballs {
            first_family: FirstFamily::Neither,
            first_count: 3,
        };
        assert_eq!(
            neither.order(&input),
            addrs(&[
                "127.0.0.1:1",
                "[::1]:1",
                "127.0.0.2:1",
                "[::1]:2",
                "[::1]:3"
            ])
        );
    }

    #[test]
    fn a_bad_bootstrap_bind_config_refuses_only_the_clusters_that_use_it() {
        let v4 = |ip: &str| core::SocketAddress {
            address: ip.into(),
            port_specifier: Some(core::socket_address::PortSpecifier::PortValue(0)),
            ..Default::default()
        };
        let two_v4 = core::BindConfig {
            source_address: Some(v4("127.0.0.3")),
            extra_source_addresses: vec![core::ExtraSourceAddress {
                address: Some(v4("127.0.0.4")),
                ..Default::default()
            }],
            ..Default::default()
        };
        let bad = BootstrapBind::compile(Some(&two_v4));
        let bare = Cluster {
            name: "c".into(),
            ..Default::default()
        };
        let e = bad.fallback(&bare).unwrap_err();
        assert_eq!(
            e.path,
            "cluster_manager.upstream_bind_config.extra_source_addresses[0].address"
        );
        assert!(
            e.message
                .starts_with("Bootstrap's upstream binding config has two same IP version"),
            "{e}"
        );
        let own = Cluster {
            upstream_bind_config: Some(core::BindConfig::default()),
            ..bare.clone()
        };
        assert_eq!(bad.fallback(&own), Ok(SourceAddresses::NONE));
        let good = BootstrapBind::compile(Some(&core::BindConfig {
            extra_source_addresses: Vec::new(),
            ..two_v4
        }));
        assert_eq!(
            good.fallback(&bare)
                .unwrap()
                .for_host("127.0.0.1:80".parse().unwrap()),
            Some("127.0.0.3:0".parse().unwrap())
        );
    }

    #[test]
    fn a_host_gets_the_source_address_of_its_ip_version_else_the_first() {
        let both = SourceAddresses {
            first: Some("127.0.0.6:0".parse().unwrap()),
            other: Some("[::6]:0".parse().unwrap()),
        };
        assert_eq!(
            both.for_host("[::1]:80".parse().unwrap()),
            Some("[::6]:0".parse().unwrap())
        );
        assert_eq!(
            both.for_host("127.0.0.1:80".parse().unwrap()),
            Some("127.0.0.6:0".parse().unwrap())
        );
        let v4 = SourceAddresses {
            other: None,
            ..both
        };
        assert_eq!(
            v4.for_host("[::1]:80".parse().unwrap()),
            Some("127.0.0.6:0".parse().unwrap())
        );
        assert_eq!(
            SourceAddresses::NONE.for_host("[::1]:80".parse().unwrap()),
            None
        );
    }
}
