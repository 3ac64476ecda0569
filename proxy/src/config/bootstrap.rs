//! `Bootstrap` -> [`BootstrapConfig`]: the static listeners and clusters plus the admin address.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use proto::pb::envoy::config::bootstrap::v3::Bootstrap;
use proto::pb::envoy::extensions::transport_sockets::tls::v3::Secret;

use super::cluster::{BootstrapBind, ClusterConfig, SourceAddresses, compile_cluster};
use super::listener::{ListenerConfig, compile_listener, socket_addr};
use super::tls::sds::{SecretRef, SecretSource};
use super::tls::secret::{self, SecretValue};
use super::upstream_transport::Socket;
use super::{ConfigError, Context, Severity, Warning, Warnings};
use crate::stats::tags::{StatsTags, TagProducer, TagSpec};

/// A compiled bootstrap.
#[derive(Debug, Clone)]
pub struct BootstrapConfig {
    /// Where the admin API listens, if anywhere.
    pub admin: Option<SocketAddr>,
    /// Static listeners.
    pub listeners: Vec<ListenerConfig>,
    /// Static clusters.
    pub clusters: Vec<ClusterConfig>,
    /// `cluster_manager.upstream_bind_config`: the source addresses of every cluster without
    /// an `upstream_bind_config` of its own (static or from CDS).
    pub upstream_bind: BootstrapBind,
    /// The bootstrap itself, for `/config_dump` and `/server_info`.
    pub proto: proto::Encoded<Bootstrap>,
    /// How stat names split into tags (`stats_config`), for `/stats/prometheus`.
    pub stats_tags: std::sync::Arc<StatsTags>,
    /// `dynamic_resources`: listeners and clusters from xDS or files; the server becomes LIVE
    /// once their initial fetch is done.
    pub dynamic: Option<super::dynamic::DynamicConfig>,
    /// The features this bootstrap uses that revoy does not implement (skipped, or failing
    /// closed), for `/config_dump`.
    pub unimplemented: Vec<Warning>,
    /// `static_resources.secrets`, compiled.
    pub secrets: Vec<StaticSecret>,
    /// When histograms are merged (`stats_flush_interval`, `stats_flush_on_admin`).
    pub stats_flush: super::stats_flush::StatsFlush,
    /// `stats_config.histogram_bucket_settings`: bucket bounds by histogram name.
    pub histogram_buckets: Vec<(crate::route::matcher::StringMatcher, Vec<f64>)>,
    /// `stats_config.stats_matcher`: the stats the admin API shows (`None`: all).
    pub stats_matcher: Option<crate::stats::matcher::StatsMatcher>,
    /// `tracing.http`: the server-wide tracer connection managers without a `provider` use.
    pub tracer: Option<std::sync::Arc<super::tracing::Provider>>,
    /// How tracers batch spans (`layered_runtime` keys).
    pub trace_flush: super::tracing::FlushSettings,
    /// The static runtime layers, which xDS resources' compiles read as the bootstrap's did.
    pub runtime: std::sync::Arc<super::runtime::StaticRuntime>,
}

/// One of `static_resources.secrets`.
#[derive(Debug, Clone)]
pub struct StaticSecret {
    /// Its compile.
    pub value: SecretValue,
    /// As configured (for `/config_dump`, which redacts private keys).
    pub proto: Secret,
}

/// Compiles a bootstrap, doing its I/O through `ctx`. Errors name the field path from the document root.
pub fn compile_bootstrap(
    ctx: &Context<'_>,
    b: &Bootstrap,
    warnings: &mut Warnings,
) -> Result<BootstrapConfig, ConfigError> {
    let first = warnings.len();
    let runtime = std::sync::Arc::new(super::runtime::StaticRuntime::compile(
        ctx,
        b.layered_runtime.as_ref(),
    )?);
    if !runtime.rtds_layers().is_empty()
        && b.dynamic_resources
            .as_ref()
            .and_then(|d| d.ads_config.as_ref())
            .is_none()
    {
        return Err(ConfigError::new(
            "layered_runtime",
            "ADS must be configured to support an ADS config source (an rtds_layer's ads: {} needs dynamic_resources.ads_config)",
        ));
    }
    let admin = b
        .admin
        .as_ref()
        .filter(|a| a.address.is_some())
        .map(|a| socket_addr(a.address.as_ref(), "admin.address"))
        .transpose()?;
    let sr = b.static_resources.clone().unwrap_or_default();
    let mut secrets: Vec<StaticSecret> = Vec::with_capacity(sr.secrets.len());
    for (i, s) in sr.secrets.iter().enumerate() {
        let path = format!("static_resources.secrets[{i}]");
        if secrets.iter().any(|o| o.proto.name == s.name) {
            return Err(ConfigError::new(
                path,
                format!("Duplicate static TlsCertificate secret name {}", s.name),
            ));
        }
        secrets.push(StaticSecret {
            value: secret::compile(ctx, s).map_err(|e| e.within(&path))?,
            proto: s.clone(),
        });
    }
    let static_secret = |refs: Vec<&SecretRef>, path: &str| -> Result<(), ConfigError> {
        for r in refs {
            if r.source == SecretSource::Static && !secrets.iter().any(|s| s.proto.name == r.name) {
                return Err(ConfigError::new(
                    path,
                    format!("Unknown static secret: {}", r.name),
                ));
            }
        }
        Ok(())
    };
    let bootstrap_bind = b
        .cluster_manager
        .as_ref()
        .and_then(|cm| cm.upstream_bind_config.as_ref());
    if bootstrap_bind.is_some_and(SourceAddresses::has_unapplied) {
        warnings.skipped(BootstrapBind::PATH, SourceAddresses::UNAPPLIED);
    }
    let upstream_bind = BootstrapBind::compile(bootstrap_bind);
    let mut clusters = Vec::with_capacity(sr.clusters.len());
    let mut seen = HashSet::new();
    for (i, c) in sr.clusters.iter().enumerate() {
        let path = format!("static_resources.clusters[{i}]");
        if !seen.insert(c.name.clone()) {
            return Err(ConfigError::new(
                path,
                format!("cluster manager: duplicate cluster '{}' found", c.name),
            ));
        }
        let compiled =
            compile_cluster(ctx, c, upstream_bind.fallback(c)?).map_err(|e| e.within(&path))?;
        for socket in compiled.transport.sockets() {
            if let Socket::Tls(tls) = socket {
                static_secret(tls.common.secrets(), &path)?;
            }
        }
        if !compiled.unreachable_endpoints.is_empty() {
            warnings.skipped(
                &path,
                format!(
                    "cluster '{}' has endpoints revoy cannot connect to yet ({}); requests to them get 'no healthy upstream'",
                    compiled.name,
                    compiled.unreachable_endpoints.join(", ")
                ),
            );
        }
        super::cluster::skipped_features(c, &path, warnings);
        for (field, why) in compiled.transport.refusals() {
            warnings.fails_closed(
                format!("{path}.{field}"),
                format!(
                    "cluster '{}': {why}; requests to the hosts it applies to fail (503, UF)",
                    compiled.name
                ),
            );
        }
        clusters.push(compiled);
    }
    let known = |name: &str| seen.contains(name);
    let mut listeners: Vec<ListenerConfig> = Vec::with_capacity(sr.listeners.len());
    let mut by_addr: HashMap<SocketAddr, String> = HashMap::new();
    for (i, l) in sr.listeners.iter().enumerate() {
        let path = format!("static_resources.listeners[{i}]");
        let before = warnings.len();
        let compiled =
            compile_listener(ctx, l, Some(&known), warnings).map_err(|e| e.within(&path))?;
        warnings.prefix_since(before, &path);
        for chain in compiled.chains.iter().chain(&compiled.default_chain) {
            if let Some(tls) = &chain.tls {
                static_secret(tls.common.secrets(), &path)?;
            }
        }
        if listeners.iter().any(|o| o.name == compiled.name) {
            return Err(ConfigError::new(
                path,
                format!(
                    "error adding listener named '{}': duplicate listener name",
                    compiled.name
                ),
            ));
        }
        if compiled.bind_to_port
            && compiled.address.port() != 0
            && let Some(other) = by_addr.insert(compiled.address, compiled.name.clone())
        {
            return Err(ConfigError::new(
                path,
                format!(
                    "error adding listener: '{}' has duplicate address '{}' as existing listener '{other}'",
                    compiled.name, compiled.address
                ),
            ));
        }
        listeners.push(compiled);
    }
    skipped_features(b, warnings);
    #[allow(deprecated)] // Envoy still falls back to the bootstrap's tracer; Istio may set it.
    let tracer = match b.tracing.as_ref().and_then(|t| t.http.as_ref()) {
        Some(h) => match super::tracing::unimplemented_tracer(h) {
            Some(name) => {
                warnings.skipped("tracing.http", super::tracing::skipped_tracer(name));
                None
            }
            None => Some(std::sync::Arc::new(
                super::tracing::compile_provider(h).map_err(|e| e.within("tracing.http"))?,
            )),
        },
        None => None,
    };
    Ok(BootstrapConfig {
        runtime,
        tracer,
        trace_flush: super::tracing::FlushSettings::from_runtime(b.layered_runtime.as_ref()),
        unimplemented: warnings
            .iter()
            .skip(first)
            .filter(|w| w.severity != Severity::Note)
            .cloned()
            .collect(),
        dynamic: super::dynamic::compile_dynamic(b)?,
        admin,
        listeners,
        clusters,
        upstream_bind,
        stats_tags: std::sync::Arc::new(stats_tags(b, warnings)),
        stats_flush: super::stats_flush::stats_flush(b)?,
        histogram_buckets: super::stats_flush::histogram_buckets(ctx, b)?,
        stats_matcher: super::stats_flush::stats_matcher(ctx, b)?,
        proto: proto::Encoded::new(b),
        secrets,
    })
}

/// Records the bootstrap's settings that revoy does not act on.
fn skipped_features(b: &Bootstrap, warnings: &mut Warnings) {
    if !b.stats_sinks.is_empty() {
        warnings.skipped(
            "stats_sinks",
            "stats sinks are not implemented by revoy; stats are only served by the admin API",
        );
    }
    if b.overload_manager.is_some() {
        warnings.skipped(
            "overload_manager",
            "the overload manager is not implemented by revoy; no load is shed",
        );
    }
    if b.hds_config.is_some() {
        warnings.skipped(
            "hds_config",
            "health discovery (HDS) is not implemented by revoy",
        );
    }
}

/// `stats_config`'s tag specifiers. One revoy cannot compile (an ECMAScript construct the
/// `regex` crate lacks) is left out with a warning: it only changes `/stats/prometheus` labels.
fn stats_tags(b: &Bootstrap, warnings: &mut Warnings) -> StatsTags {
    use proto::pb::envoy::config::metrics::v3::tag_specifier::TagValue;
    let Some(sc) = &b.stats_config else {
        return StatsTags::new(true, Vec::new());
    };
    let use_defaults = sc.use_all_default_tags.as_ref().is_none_or(|v| v.value);
    let mut specs = Vec::new();
    for (i, t) in sc.stats_tags.iter().enumerate() {
        let spec = match &t.tag_value {
            Some(TagValue::Regex(r)) => TagSpec::Regex(r.clone()),
            Some(TagValue::FixedValue(v)) => TagSpec::Fixed(v.clone()),
            None => TagSpec::Default,
        };
        let one = [(t.tag_name.clone(), spec.clone())];
        match TagProducer::with(false, &one) {
            Ok(_) => specs.push((t.tag_name.clone(), spec)),
            Err(e) => warnings.skipped(
                format!("stats_config.stats_tags[{i}]"),
                format!("{e}; tag left out"),
            ),
        }
    }
    StatsTags::new(use_defaults, specs)
}
