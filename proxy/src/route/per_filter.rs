//! Routes' `typed_per_filter_config`, compiled by `config::http_filter` and read by the HTTP
//! filters: whether a filter runs on a route, and the configuration replacing its own. Each
//! filter's per-route configuration is its own type, found by downcasting (as Envoy's
//! `mostSpecificPerFilterConfigTyped`), so routes need not know the filters.

use std::any::Any;
use std::fmt::Debug;
use std::sync::Arc;

/// A filter's compiled per-route configuration.
pub trait FilterRouteConfig: Any + Debug + Send + Sync {}

impl<T: Any + Debug + Send + Sync> FilterRouteConfig for T {}

/// A route's, virtual host's or route configuration's `typed_per_filter_config`, by filter
/// name, and the deprecated `cors` field of a virtual host or route action.
#[derive(Debug, Clone, Default)]
pub struct PerFilterConfigs(
    pub Vec<(Arc<str>, PerRoute)>,
    pub Option<Arc<dyn FilterRouteConfig>>,
);

impl PerFilterConfigs {
    /// The entry for the filter named `name`.
    pub fn get(&self, name: &str) -> Option<&PerRoute> {
        self.0.iter().find(|(n, _)| &**n == name).map(|(_, c)| c)
    }

    /// The deprecated `cors` policy of the virtual host or route action, if set (the CORS
    /// filter reads it when no level has a per-route policy).
    pub fn legacy_cors(&self) -> Option<&dyn FilterRouteConfig> {
        self.1.as_deref()
    }

    /// `configs` with the deprecated `cors` policy `legacy` added.
    pub fn with_legacy_cors(
        configs: Option<Box<PerFilterConfigs>>,
        legacy: Option<Arc<dyn FilterRouteConfig>>,
    ) -> Option<Box<PerFilterConfigs>> {
        let Some(legacy) = legacy else {
            return configs;
        };
        let mut configs = configs.unwrap_or_default();
        configs.1 = Some(legacy);
        Some(configs)
    }
}

/// What a route (or virtual host, or route configuration) says about one filter.
#[derive(Debug, Clone)]
pub enum PerRoute {
    /// `FilterConfig{disabled: true}`: the filter does not run here.
    Disabled,
    /// `FilterConfig{config: {}}` (an empty config): the filter runs here (even if `disabled`
    /// in the chain) with its filter-level configuration.
    Enabled,
    /// The filter runs here with this configuration instead of its filter-level one.
    Config(Arc<dyn FilterRouteConfig>),
}

impl PerRoute {
    /// Whether the filter is disabled here.
    pub fn disabled(&self) -> bool {
        matches!(self, PerRoute::Disabled)
    }

    /// The configuration replacing the filter's own here, if any.
    pub fn config(&self) -> Option<&dyn FilterRouteConfig> {
        match self {
            PerRoute::Config(c) => Some(&**c),
            _ => None,
        }
    }
}
