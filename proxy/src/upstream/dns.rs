//! STRICT_DNS and LOGICAL_DNS resolution with the system resolver, repeated every
//! `dns_refresh_rate`. A failed lookup keeps the endpoint's previous addresses, like Envoy, and
//! is counted in `update_failure` (a lookup that answered in `update_success`). A STRICT_DNS
//! endpoint becomes a host per address its name resolves to (of the families
//! `dns_lookup_family` keeps); a LOGICAL_DNS one a single host named by the first address and
//! reached at all of them with Happy Eyeballs, as Envoy's logical host keeps its whole
//! address list (`dns_lookup_family: ALL` gives it both families).

use std::net::SocketAddr;
use std::sync::{Arc, Weak};

use crate::config::cluster::{DnsLookupFamily, EndpointAddress, EndpointConfig};

use super::cluster::Cluster;
use super::host::Host;

/// Starts the resolution loop of a DNS cluster on the current tokio runtime.
pub(crate) fn start(cluster: &Arc<Cluster>) {
    let weak = Arc::downgrade(cluster);
    let task = tokio::spawn(run(weak));
    cluster.set_resolver(task.abort_handle());
}

async fn run(weak: Weak<Cluster>) {
    let Some((endpoints, family, logical, refresh)) = weak.upgrade().map(|c| {
        let cfg = c.config();
        (
            cfg.endpoints.clone(),
            cfg.dns_lookup_family,
            cfg.discovery == crate::config::cluster::Discovery::LogicalDns,
            cfg.dns_refresh_rate,
        )
    }) else {
        return;
    };
    let mut last: Vec<Vec<SocketAddr>> = vec![Vec::new(); endpoints.len()];
    loop {
        // Counted like Envoy's per-endpoint resolve targets (an IP endpoint resolves to itself).
        let mut failures = 0;
        for (ep, known) in endpoints.iter().zip(last.iter_mut()) {
            let resolved = match &ep.address {
                EndpointAddress::Ip(addr) => vec![*addr],
                EndpointAddress::Dns { host, port } => match resolve(host, *port, family).await {
                    Ok(addrs) => addrs,
                    Err(e) => {
                        tracing::debug!(%host, error = %e, "DNS resolution failed");
                        failures += 1;
                        Vec::new()
                    }
                },
            };
            if !resolved.is_empty() {
                *known = resolved;
            }
        }
        let Some(cluster) = weak.upgrade() else {
            return;
        };
        let stats = cluster.stats();
        stats.update_attempt().add(endpoints.len() as u64);
        stats
            .update_success()
            .add((endpoints.len() - failures) as u64);
        stats.update_failure().add(failures as u64);
        cluster.set_hosts(hosts(&cluster, &endpoints, &last, logical));
        drop(cluster);
        tokio::time::sleep(refresh).await;
    }
}

fn hosts(
    cluster: &Cluster,
    endpoints: &[EndpointConfig],
    addrs: &[Vec<SocketAddr>],
    logical: bool,
) -> Vec<Host> {
    let mut out = Vec::new();
    for (ep, addrs) in endpoints.iter().zip(addrs) {
        let name = match &ep.address {
            EndpointAddress::Ip(a) => a.ip().to_string(),
            EndpointAddress::Dns { host, .. } => host.clone(),
        };
        let host = |addr: SocketAddr| {
            Host::new(
                addr,
                name.clone(),
                ep.weight,
                ep.priority,
                ep.locality.clone(),
                ep.health,
            )
            .with_transport(cluster.transport(ep.socket))
        };
        match addrs.first() {
            Some(&first) if logical => out.push(cluster.reached_at(host(first), addrs)),
            _ => out.extend(addrs.iter().map(|&addr| host(addr))),
        }
    }
    out
}

/// Resolves `host:port` with the system resolver, filtered by `family`.
pub async fn resolve(
    host: &str,
    port: u16,
    family: DnsLookupFamily,
) -> std::io::Result<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port)).await?.collect();
    Ok(filter_family(addrs, family))
}

/// Applies `dns_lookup_family` to resolved addresses, dropping duplicates and keeping order.
pub fn filter_family(addrs: Vec<SocketAddr>, family: DnsLookupFamily) -> Vec<SocketAddr> {
    let has_v4 = addrs.iter().any(SocketAddr::is_ipv4);
    let has_v6 = addrs.iter().any(SocketAddr::is_ipv6);
    let keep_v4 = match family {
        DnsLookupFamily::V4Only | DnsLookupFamily::All => true,
        DnsLookupFamily::V6Only => false,
        DnsLookupFamily::Auto => !has_v6,
        DnsLookupFamily::V4Preferred => true,
    };
    let keep_v6 = match family {
        DnsLookupFamily::V6Only | DnsLookupFamily::All | DnsLookupFamily::Auto => true,
        DnsLookupFamily::V4Only => false,
        DnsLookupFamily::V4Preferred => !has_v4,
    };
    let mut out: Vec<SocketAddr> = Vec::with_capacity(addrs.len());
    for a in addrs {
        if (if a.is_ipv4() { keep_v4 } else { keep_v6 }) && !out.contains(&a) {
            out.push(a);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs() -> Vec<SocketAddr> {
        ["127.0.0.1:80", "[::1]:80", "127.0.0.1:80", "127.0.0.2:80"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect()
    }

    #[test]
    fn lookup_family_semantics() {
        let ports = |v: Vec<SocketAddr>| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        assert_eq!(
            ports(filter_family(addrs(), DnsLookupFamily::Auto)),
            ["[::1]:80"]
        );
        assert_eq!(
            ports(filter_family(addrs(), DnsLookupFamily::V4Only)),
            ["127.0.0.1:80", "127.0.0.2:80"]
        );
        assert_eq!(
            ports(filter_family(addrs(), DnsLookupFamily::V4Preferred)),
            ["127.0.0.1:80", "127.0.0.2:80"]
        );
        assert_eq!(ports(filter_family(addrs(), DnsLookupFamily::All)).len(), 3);
        let v4: Vec<SocketAddr> = vec!["127.0.0.1:80".parse().unwrap()];
        assert_eq!(filter_family(v4.clone(), DnsLookupFamily::Auto), v4);
        assert!(filter_family(v4, DnsLookupFamily::V6Only).is_empty());
    }
}
