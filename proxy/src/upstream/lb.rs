//! Host selection: priority levels (with Envoy's 1.4 overprovisioning spill and per-priority
//! panic mode) and the load balancing policies within a level.
//!
//! RING_HASH and MAGLEV are served by weighted rendezvous hashing on [`LbContext::hash`]: the
//! same hash picks the same host while the host set is unchanged, and a host change only moves
//! the keys of that host. Without a hash they pick at random.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rand::Rng;

use crate::config::cluster::LbPolicy;
use crate::config::istio::alpn::AlpnOverrides;

use super::host::Host;

/// Per-request inputs to host selection.
#[derive(Debug, Clone, Default)]
pub struct LbContext {
    /// The request hash (route hash_policy) for RING_HASH/MAGLEV.
    pub hash: Option<u64>,
    /// The downstream connection's original destination (ORIGINAL_DST clusters).
    pub original_dst: Option<SocketAddr>,
    /// Whether the downstream connection is HTTP/2 (for `use_downstream_protocol_config`).
    pub downstream_h2: bool,
    /// Whether the request is internal (`x-envoy-internal: true`): selects `internal.*` rather
    /// than `external.*` response code stats.
    pub internal: bool,
    /// Hosts already tried (retries with `previous_hosts`): avoided when others exist.
    pub avoid: Vec<SocketAddr>,
    /// Attach the answering host to the response as an [`UpstreamHost`](super::UpstreamHost)
    /// extension (costs allocations; asked for only when header formatters may need it),
    /// with the address its connection reached as `target` noted it (the host's own without
    /// a `target`).
    pub report_host: bool,
    /// Where each attempt notes its host and connection when they are known (set when an
    /// access log or a response header formatter reads them).
    pub target: Option<Arc<super::AttemptTarget>>,
    /// The ALPN lists `istio.alpn` chose for the request's upstream TLS connections.
    pub alpn: Option<RequestAlpn>,
}

/// A request's `istio.alpn` overrides, with what picks among them.
#[derive(Debug, Clone)]
pub struct RequestAlpn {
    /// The list per upstream protocol.
    pub overrides: Arc<AlpnOverrides>,
    /// Whether the downstream request is HTTP/1.0 (a cluster using the downstream protocol
    /// then goes upstream in HTTP/1.0, as Envoy counts it).
    pub downstream_http10: bool,
}

const OVERPROVISIONING: u64 = 140;
const AVOID_ATTEMPTS: usize = 3;

/// The hosts of a cluster arranged for selection. Immutable; rebuilt when hosts change.
#[derive(Debug, Default)]
pub struct HostSet {
    hosts: Vec<Arc<Host>>,
    levels: Vec<Level>,
    /// Cumulative load percentage per level; the last is 100.
    cumulative_load: Vec<u32>,
    healthy: usize,
}

#[derive(Debug)]
struct Level {
    targets: Weighted,
}

impl HostSet {
    /// Arranges `hosts` by priority. `panic_threshold` is in percent.
    pub fn new(hosts: Vec<Arc<Host>>, panic_threshold: f64) -> Self {
        let mut by_priority: BTreeMap<u32, Vec<Arc<Host>>> = BTreeMap::new();
        for h in &hosts {
            by_priority.entry(h.priority).or_default().push(h.clone());
        }
        let healthy = hosts.iter().filter(|h| h.is_healthy()).count();
        let mut health = Vec::with_capacity(by_priority.len());
        // Exactly as many as there are priorities: the set lives as long as its hosts do.
        let mut levels = Vec::with_capacity(by_priority.len());
        for members in by_priority.into_values() {
            let total = members.len() as u64;
            let ok = members.iter().filter(|h| h.is_healthy()).count() as u64;
            health.push((OVERPROVISIONING * ok / total).min(100) as u32);
            let panic = (100 * ok) as f64 / (total as f64) < panic_threshold;
            let targets = if panic {
                members
            } else {
                members.into_iter().filter(|h| h.is_healthy()).collect()
            };
            levels.push(Level {
                targets: Weighted::new(targets),
            });
        }
        let cumulative_load = priority_loads(&health)
            .into_iter()
            .scan(0, |acc, l| {
                *acc += l;
                Some(*acc)
            })
            .collect();
        HostSet {
            hosts,
            levels,
            cumulative_load,
            healthy,
        }
    }

    /// Every host, in configuration order.
    pub fn hosts(&self) -> &[Arc<Host>] {
        &self.hosts
    }

    /// How many hosts are healthy.
    pub fn healthy_count(&self) -> usize {
        self.healthy
    }

    /// Picks a host with `policy`, or `None` when there is none.
    pub fn pick(&self, policy: LbPolicy, ctx: &LbContext) -> Option<Arc<Host>> {
        let level = match self.levels.len() {
            0 => return None,
            1 => &self.levels[0],
            _ => {
                let r = rand::rng().random_range(0..100);
                let i = self
                    .cumulative_load
                    .iter()
                    .position(|c| r < *c)
                    .unwrap_or(0);
                &self.levels[i]
            }
        };
        let mut chosen = level.targets.pick(policy, ctx.hash)?;
        for _ in 1..AVOID_ATTEMPTS {
            if !ctx.avoid.contains(&chosen.addr) {
                break;
            }
            chosen = level
                .targets
                .pick(policy, ctx.hash.map(|h| h.wrapping_add(1)))?;
        }
        Some(chosen)
    }
}

/// Envoy's priority load: each level takes up to its (overprovisioned) health, the rest
/// spills to the next; when total health is below 100 the loads are scaled up to sum to 100.
/// All levels at zero health send everything to the first level.
fn priority_loads(health: &[u32]) -> Vec<u32> {
    let total: u32 = health.iter().sum::<u32>().min(100);
    let mut loads = vec![0; health.len()];
    if total == 0 {
        if let Some(first) = loads.first_mut() {
            *first = 100;
        }
        return loads;
    }
    let mut remaining = 100u32;
    for (l, h) in loads.iter_mut().zip(health) {
        *l = (*h).min(remaining);
        remaining -= *l;
    }
    if total < 100 {
        let mut assigned = 0;
        for l in loads.iter_mut() {
            *l = *l * 100 / total;
            assigned += *l;
        }
        if let Some(l) = loads.iter_mut().find(|l| **l > 0) {
            *l += 100 - assigned;
        }
    }
    loads
}

/// Hosts with weights, ready for O(log n) weighted picks.
#[derive(Debug)]
struct Weighted {
    hosts: Vec<Arc<Host>>,
    /// Cumulative weights; empty when all weights are equal.
    cumulative: Vec<u64>,
    total: u64,
    /// Round robin visits weight slots `i * stride mod total`: a stride coprime with the total
    /// visits every slot once per cycle (exact proportions) while interleaving the hosts.
    stride: u64,
    rr: AtomicU64,
}

impl Weighted {
    fn new(hosts: Vec<Arc<Host>>) -> Self {
        let equal = hosts.windows(2).all(|w| w[0].weight == w[1].weight);
        let (cumulative, total) = if equal {
            (Vec::new(), hosts.len() as u64)
        } else {
            let mut acc = 0u64;
            let c: Vec<u64> = hosts
                .iter()
                .map(|h| {
                    acc += u64::from(h.weight.max(1));
                    acc
                })
                .collect();
            (c, acc)
        };
        let start = if total > 0 {
            rand::rng().random_range(0..total)
        } else {
            0
        };
        Weighted {
            hosts,
            cumulative,
            stride: spreading_stride(total),
            total,
            rr: AtomicU64::new(start),
        }
    }

    fn at(&self, w: u64) -> &Arc<Host> {
        if self.cumulative.is_empty() {
            &self.hosts[w as usize]
        } else {
            let i = self.cumulative.partition_point(|c| *c <= w);
            &self.hosts[i]
        }
    }

    fn random(&self) -> &Arc<Host> {
        self.at(rand::rng().random_range(0..self.total))
    }

    fn pick(&self, policy: LbPolicy, hash: Option<u64>) -> Option<Arc<Host>> {
        if self.hosts.is_empty() {
            return None;
        }
        let h = match policy {
            LbPolicy::RoundRobin | LbPolicy::ClusterProvided => {
                let i = self.rr.fetch_add(1, Ordering::Relaxed) % self.total;
                self.at(i * self.stride % self.total)
            }
            LbPolicy::Random => self.random(),
            LbPolicy::LeastRequest { choices } => {
                let active = |h: &Host| h.stats.rq_active.load(Ordering::Relaxed);
                let mut best = self.random();
                for _ in 1..choices {
                    let other = self.random();
                    if active(other) < active(best) {
                        best = other;
                    }
                }
                best
            }
            LbPolicy::ConsistentHash => match hash {
                Some(hash) => self.rendezvous(hash),
                None => self.random(),
            },
        };
        Some(h.clone())
    }

    /// Weighted rendezvous hashing: the host with the highest `weight / -ln(u)` where `u` is a
    /// uniform value derived from (hash, host address).
    fn rendezvous(&self, hash: u64) -> &Arc<Host> {
        let mut best = &self.hosts[0];
        let mut best_score = f64::MIN;
        for h in &self.hosts {
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            hash.hash(&mut hasher);
            h.addr.hash(&mut hasher);
            let u = ((hasher.finish() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            let score = f64::from(h.weight.max(1)) / -u.ln();
            if score > best_score {
                best_score = score;
                best = h;
            }
        }
        best
    }
}

/// The first number from about 0.618 x `total` (golden ratio) that is coprime with `total`.
fn spreading_stride(total: u64) -> u64 {
    if total <= 2 {
        return 1;
    }
    let gcd = |mut a: u64, mut b: u64| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    (total * 618 / 1000..total)
        .find(|s| *s > 0 && gcd(*s, total) == 1)
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::cluster::{HealthStatus, Locality};
    use std::collections::HashMap;

    fn host(port: u16, weight: u32, priority: u32, health: HealthStatus) -> Arc<Host> {
        Arc::new(Host::new(
            SocketAddr::from(([127, 0, 0, 1], port)),
            String::new(),
            weight,
            priority,
            std::sync::Arc::new(Locality::default()),
            health,
        ))
    }

    fn counts(set: &HostSet, policy: LbPolicy, n: usize) -> HashMap<u16, usize> {
        let mut m = HashMap::new();
        for _ in 0..n {
            let h = set.pick(policy, &LbContext::default()).unwrap();
            *m.entry(h.addr.port()).or_default() += 1;
        }
        m
    }

    #[test]
    fn weighted_round_robin_is_exact_over_a_cycle() {
        let set = HostSet::new(
            vec![
                host(1, 3, 0, HealthStatus::Healthy),
                host(2, 1, 0, HealthStatus::Healthy),
            ],
            50.0,
        );
        let m = counts(&set, LbPolicy::RoundRobin, 400);
        assert_eq!(m[&1], 300);
        assert_eq!(m[&2], 100);
    }

    #[test]
    fn weighted_round_robin_interleaves() {
        let set = HostSet::new(
            vec![
                host(1, 1, 0, HealthStatus::Healthy),
                host(2, 1, 0, HealthStatus::Healthy),
                host(3, 2, 0, HealthStatus::Healthy),
            ],
            50.0,
        );
        let seq: Vec<u16> = (0..8)
            .map(|_| {
                set.pick(LbPolicy::RoundRobin, &LbContext::default())
                    .unwrap()
                    .addr
                    .port()
            })
            .collect();
        // Never the same host three times in a row, whatever the starting offset.
        assert!(
            seq.windows(3).all(|w| !(w[0] == w[1] && w[1] == w[2])),
            "{seq:?}"
        );
        assert_eq!(seq.iter().filter(|p| **p == 3).count(), 4);
    }

    #[test]
    fn equal_round_robin_alternates() {
        let set = HostSet::new(
            vec![
                host(1, 1, 0, HealthStatus::Healthy),
                host(2, 1, 0, HealthStatus::Healthy),
            ],
            50.0,
        );
        let a = set
            .pick(LbPolicy::RoundRobin, &LbContext::default())
            .unwrap();
        let b = set
            .pick(LbPolicy::RoundRobin, &LbContext::default())
            .unwrap();
        assert_ne!(a.addr, b.addr);
    }

    #[test]
    fn random_and_least_request_reach_every_host() {
        let set = HostSet::new(
            (1..=4)
                .map(|p| host(p, 1, 0, HealthStatus::Healthy))
                .collect(),
            50.0,
        );
        for policy in [LbPolicy::Random, LbPolicy::LeastRequest { choices: 2 }] {
            let m = counts(&set, policy, 4000);
            assert_eq!(m.len(), 4);
            assert!(m.values().all(|c| *c > 500), "{policy:?} {m:?}");
        }
    }

    #[test]
    fn least_request_avoids_busy_host() {
        let busy = host(1, 1, 0, HealthStatus::Healthy);
        busy.stats.rq_active.store(10, Ordering::Relaxed);
        let set = HostSet::new(vec![busy, host(2, 1, 0, HealthStatus::Healthy)], 50.0);
        let m = counts(&set, LbPolicy::LeastRequest { choices: 2 }, 1000);
        // Host 1 wins only when both choices land on it (about a quarter of the time).
        assert!(m[&2] > m.get(&1).copied().unwrap_or(0) * 2, "{m:?}");
    }

    #[test]
    fn least_request_with_many_choices_never_takes_the_busy_host() {
        let busy = host(1, 1, 0, HealthStatus::Healthy);
        busy.stats.rq_active.store(1, Ordering::Relaxed);
        let set = HostSet::new(vec![busy, host(2, 1, 0, HealthStatus::Healthy)], 50.0);
        // All 40 choices land on the busy host about once in 2^40 picks.
        let m = counts(&set, LbPolicy::LeastRequest { choices: 40 }, 1000);
        assert_eq!(m.get(&1), None, "{m:?}");
    }

    #[test]
    fn consistent_hash_is_stable_and_spreads() {
        let set = HostSet::new(
            (1..=5)
                .map(|p| host(p, 1, 0, HealthStatus::Healthy))
                .collect(),
            50.0,
        );
        let mut seen = std::collections::HashSet::new();
        for key in 0..200u64 {
            let ctx = LbContext {
                hash: Some(key),
                ..Default::default()
            };
            let a = set.pick(LbPolicy::ConsistentHash, &ctx).unwrap();
            let b = set.pick(LbPolicy::ConsistentHash, &ctx).unwrap();
            assert_eq!(a.addr, b.addr);
            seen.insert(a.addr);
        }
        assert_eq!(seen.len(), 5);
    }

    #[test]
    fn lowest_healthy_priority_takes_all_traffic() {
        let set = HostSet::new(
            vec![
                host(1, 1, 0, HealthStatus::Healthy),
                host(2, 1, 1, HealthStatus::Healthy),
            ],
            50.0,
        );
        assert_eq!(counts(&set, LbPolicy::RoundRobin, 100)[&1], 100);
    }

    #[test]
    fn unhealthy_priority_spills_to_next() {
        let set = HostSet::new(
            vec![
                host(1, 1, 0, HealthStatus::Unhealthy),
                host(2, 1, 1, HealthStatus::Healthy),
            ],
            50.0,
        );
        assert_eq!(counts(&set, LbPolicy::RoundRobin, 100)[&2], 100);
    }

    #[test]
    fn partial_health_spills_with_overprovisioning() {
        assert_eq!(priority_loads(&[70, 100]), vec![70, 30]);
        assert_eq!(priority_loads(&[100, 100]), vec![100, 0]);
        assert_eq!(priority_loads(&[0, 0]), vec![100, 0]);
        assert_eq!(priority_loads(&[20, 30]), vec![40, 60]);
    }

    #[test]
    fn panic_mode_uses_unhealthy_hosts() {
        let set = HostSet::new(
            vec![
                host(1, 1, 0, HealthStatus::Unhealthy),
                host(2, 1, 0, HealthStatus::Unhealthy),
            ],
            50.0,
        );
        assert_eq!(counts(&set, LbPolicy::RoundRobin, 10).len(), 2);
        assert_eq!(set.healthy_count(), 0);
    }

    #[test]
    fn avoids_previous_hosts_when_possible() {
        let set = HostSet::new(
            vec![
                host(1, 1, 0, HealthStatus::Healthy),
                host(2, 1, 0, HealthStatus::Healthy),
            ],
            50.0,
        );
        let ctx = LbContext {
            avoid: vec![SocketAddr::from(([127, 0, 0, 1], 1))],
            ..Default::default()
        };
        for _ in 0..20 {
            assert_eq!(set.pick(LbPolicy::RoundRobin, &ctx).unwrap().addr.port(), 2);
        }
    }

    #[test]
    fn empty_set_picks_nothing() {
        let set = HostSet::new(Vec::new(), 50.0);
        assert!(
            set.pick(LbPolicy::RoundRobin, &LbContext::default())
                .is_none()
        );
    }
}
