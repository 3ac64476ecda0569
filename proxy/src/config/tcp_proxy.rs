//! `envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy` -> [`TcpProxyConfig`].

use std::time::Duration;

use proto::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};

use super::ConfigError;
use super::cluster::duration;
use crate::route::format::Template;
use crate::route::headers::HeaderMutations;

const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);

/// A compiled tcp_proxy filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpProxyConfig {
    /// `stat_prefix` (stats are `tcp.<stat_prefix>.*`).
    pub stat_prefix: String,
    /// Where connections go.
    pub route: TcpRoute,
    /// `idle_timeout` (default 1 h; `None` when set to 0).
    pub idle_timeout: Option<Duration>,
    /// `max_downstream_connection_duration`, if set.
    pub max_connection_duration: Option<Duration>,
    /// `max_connect_attempts` (default 1).
    pub max_connect_attempts: u32,
    /// `access_log`: written per connection.
    pub access_logs: crate::access_log::AccessLogs,
    /// `tunneling_config`: the bytes go through an HTTP CONNECT (or POST) tunnel.
    pub tunneling: Option<Tunneling>,
}

/// `tunneling_config`: how a connection is carried over HTTP to the upstream.
#[derive(Debug, Clone)]
pub struct Tunneling {
    /// `hostname`: the CONNECT authority (command operators allowed).
    pub hostname: Template,
    /// `use_post`: a POST to [`Tunneling::post_path`] instead of a CONNECT.
    pub use_post: bool,
    /// `post_path` (default `/`).
    pub post_path: String,
    /// `headers_to_add`: added to the tunnel's request.
    pub headers: HeaderMutations,
    /// What it was compiled from: tunnels compare by it.
    source: tcp_proxy::TunnelingConfig,
}

impl PartialEq for Tunneling {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Eq for Tunneling {}

/// The upstream cluster choice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TcpRoute {
    /// `cluster`.
    Cluster(String),
    /// `weighted_clusters`: (name, weight) pairs, weights at least 1.
    Weighted(Vec<(String, u32)>),
}

/// Compiles a TcpProxy. Errors and warnings name the field path relative to the message.
pub fn compile_tcp_proxy(
    ctx: &super::Context<'_>,
    p: &TcpProxy,
    warnings: &mut super::Warnings,
) -> Result<TcpProxyConfig, ConfigError> {
    if p.stat_prefix.is_empty() {
        return Err(ConfigError::new(
            "stat_prefix",
            "value length must be at least 1 characters",
        ));
    }
    let route = match &p.cluster_specifier {
        Some(tcp_proxy::ClusterSpecifier::Cluster(c)) => TcpRoute::Cluster(c.clone()),
        Some(tcp_proxy::ClusterSpecifier::WeightedClusters(w)) => {
            if w.clusters.is_empty() {
                return Err(ConfigError::new(
                    "weighted_clusters.clusters",
                    "value must contain at least 1 item(s)",
                ));
            }
            let mut out = Vec::with_capacity(w.clusters.len());
            for (i, c) in w.clusters.iter().enumerate() {
                if c.name.is_empty() {
                    return Err(ConfigError::new(
                        format!("weighted_clusters.clusters[{i}].name"),
                        "value length must be at least 1 characters",
                    ));
                }
                if c.weight == 0 {
                    return Err(ConfigError::new(
                        format!("weighted_clusters.clusters[{i}].weight"),
                        "value must be greater than or equal to 1",
                    ));
                }
                out.push((c.name.clone(), c.weight));
            }
            TcpRoute::Weighted(out)
        }
        None => {
            return Err(ConfigError::new("cluster_specifier", "value is required"));
        }
    };
    let idle_timeout = match &p.idle_timeout {
        Some(d) => Some(duration(d, "idle_timeout")?).filter(|d| !d.is_zero()),
        None => Some(DEFAULT_IDLE_TIMEOUT),
    };
    let max_connection_duration = match &p.max_downstream_connection_duration {
        Some(d) => {
            Some(duration(d, "max_downstream_connection_duration")?).filter(|d| !d.is_zero())
        }
        None => None,
    };
    let max_connect_attempts = match &p.max_connect_attempts {
        Some(v) if v.value == 0 => {
            return Err(ConfigError::new(
                "max_connect_attempts",
                "value must be greater than or equal to 1",
            ));
        }
        Some(v) => v.value,
        None => 1,
    };
    let tunneling = p
        .tunneling_config
        .as_ref()
        .map(|t| tunneling(ctx, t).map_err(|e| e.within("tunneling_config")))
        .transpose()?;
    let before = warnings.len();
    let access_logs = super::access_log::compile_access_logs(ctx, &p.access_log, warnings);
    warnings.prefix_since(before, "access_log");
    let access_logs = access_logs.map_err(|e| e.within("access_log"))?;
    Ok(TcpProxyConfig {
        tunneling,
        stat_prefix: p.stat_prefix.clone(),
        route,
        idle_timeout,
        max_connection_duration,
        max_connect_attempts,
        access_logs,
    })
}

/// Compiles a `TunnelingConfig`.
fn tunneling(
    ctx: &super::Context<'_>,
    t: &tcp_proxy::TunnelingConfig,
) -> Result<Tunneling, ConfigError> {
    if t.hostname.is_empty() {
        return Err(ConfigError::new(
            "hostname",
            "value length must be at least 1 characters",
        ));
    }
    if !t.post_path.is_empty() && !t.use_post {
        return Err(ConfigError::new(
            "post_path",
            "Can't set a post path when POST method isn't used",
        ));
    }
    for (set, field) in [
        (t.propagate_response_headers, "propagate_response_headers"),
        (t.propagate_response_trailers, "propagate_response_trailers"),
        (t.request_id_extension.is_some(), "request_id_extension"),
    ] {
        if set {
            return Err(ConfigError::new(
                field,
                "is not implemented by revoy (it has no filter state to keep them in)",
            ));
        }
    }
    Ok(Tunneling {
        hostname: Template::parse(&t.hostname, ctx).map_err(|m| ConfigError::new("hostname", m))?,
        use_post: t.use_post,
        post_path: if t.post_path.is_empty() {
            "/".to_owned()
        } else {
            t.post_path.clone()
        },
        headers: super::route::header_mutations(ctx, &t.headers_to_add, &[])
            .map_err(|e| e.within("headers_to_add"))?,
        source: t.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::pb::envoy::extensions::filters::network::tcp_proxy::v3::tcp_proxy::{
        WeightedCluster, weighted_cluster::ClusterWeight,
    };
    use proto::pb::google::protobuf::Duration as PbDuration;

    fn compile(p: &TcpProxy) -> Result<TcpProxyConfig, ConfigError> {
        let io = crate::config::context::FakeIo::new();
        compile_tcp_proxy(
            &crate::config::Context::new(&io),
            p,
            &mut crate::config::Warnings::new(),
        )
    }

    fn proxy(spec: Option<tcp_proxy::ClusterSpecifier>) -> TcpProxy {
        TcpProxy {
            stat_prefix: "tcp".into(),
            cluster_specifier: spec,
            ..Default::default()
        }
    }

    #[test]
    fn defaults_and_single_cluster() {
        let c = compile(&proxy(Some(tcp_proxy::ClusterSpecifier::Cluster(
            "db".into(),
        ))))
        .unwrap();
        assert_eq!(c.route, TcpRoute::Cluster("db".into()));
        assert_eq!(c.idle_timeout, Some(Duration::from_secs(3600)));
        assert_eq!(c.max_connect_attempts, 1);
    }

    #[test]
    fn zero_idle_timeout_disables_it() {
        let mut p = proxy(Some(tcp_proxy::ClusterSpecifier::Cluster("db".into())));
        p.idle_timeout = Some(PbDuration {
            seconds: 0,
            nanos: 0,
        });
        assert_eq!(compile(&p).unwrap().idle_timeout, None);
    }

    #[test]
    fn errors_name_fields() {
        let e = compile(&proxy(None)).unwrap_err();
        assert_eq!(e.path, "cluster_specifier");
        let weighted = WeightedCluster {
            clusters: vec![
                ClusterWeight {
                    name: "a".into(),
                    weight: 1,
                    ..Default::default()
                },
                ClusterWeight {
                    name: "b".into(),
                    weight: 0,
                    ..Default::default()
                },
            ],
        };
        let e = compile(&proxy(Some(tcp_proxy::ClusterSpecifier::WeightedClusters(
            weighted,
        ))))
        .unwrap_err();
        assert_eq!(e.path, "weighted_clusters.clusters[1].weight");
        let mut p = proxy(Some(tcp_proxy::ClusterSpecifier::Cluster("db".into())));
        p.stat_prefix.clear();
        assert_eq!(compile(&p).unwrap_err().path, "stat_prefix");
    }
}
