//! Which extensions revoy does not implement would leave it less safe than its config if they
//! were skipped: access control, authentication, rate and connection limits, and filters that
//! run arbitrary code (which may deny). A chain that carries one refuses its traffic instead
//! (HTTP, network and listener filters alike).

/// Extension names (the segment after `envoy.filters.http.` / `envoy.filters.network.`, or
/// after `envoy.extensions.filters.http.` / `...network.` in a type URL) that fail closed.
const FAIL_CLOSED: &[&str] = &[
    "ext_authz",
    "rate_limit_quota",
    "oauth2",
    "basic_auth",
    "api_key_auth",
    "ext_proc",
    "lua",
    "wasm",
    "golang",
    "dynamic_modules",
    "composite",
    "admission_control",
    "adaptive_concurrency",
    "bandwidth_limit",
    "connection_limit",
    "client_ssl_auth",
    // It may set the filter state RBAC rules read as Istio's principals (waypoints set
    // `io.istio.peer_principal` with it), which revoy's rules take from `istio_authn` alone.
    "set_filter_state",
];

/// Words (between `.`, `_`, `-` or `/`) that mark a filter of unknown kind (Istio's, a
/// vendor's) as one that controls access.
const SECURITY_WORDS: &[&str] = &[
    "auth",
    "authn",
    "authz",
    "oauth",
    "oauth2",
    "rbac",
    "ratelimit",
    "ratelimiter",
    "jwt",
    "csrf",
];

/// Whether an HTTP or network filter revoy does not implement, named `name` with config type
/// `type_name` (either may be empty), must deny its traffic rather than be skipped.
pub fn filter_fails_closed(name: &str, type_name: &str) -> bool {
    let keys = [extension_key(name), extension_key(type_name)];
    keys.iter().flatten().any(|k| FAIL_CLOSED.contains(k))
        || [name, type_name].iter().any(|s| names_access_control(s))
}

/// Whether `s` has a word of [`SECURITY_WORDS`], or `rate` followed by `limit`.
fn names_access_control(s: &str) -> bool {
    let s = s.to_ascii_lowercase();
    let words: Vec<&str> = s.split(['.', '_', '-', '/']).collect();
    words.iter().any(|w| SECURITY_WORDS.contains(w))
        || words.windows(2).any(|p| p == ["rate", "limit"])
}

/// The extension's own segment: `rbac` for `envoy.filters.http.rbac` and for
/// `envoy.extensions.filters.http.rbac.v3.RBAC`.
fn extension_key(s: &str) -> Option<&str> {
    let rest = s
        .strip_prefix("envoy.extensions.filters.http.")
        .or_else(|| s.strip_prefix("envoy.extensions.filters.network."))
        .or_else(|| s.strip_prefix("envoy.extensions.filters.listener."))
        .or_else(|| s.strip_prefix("envoy.filters.http."))
        .or_else(|| s.strip_prefix("envoy.filters.network."))
        .or_else(|| s.strip_prefix("envoy.filters.listener."))?;
    rest.split('.').next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_control_and_limits_fail_closed() {
        assert!(filter_fails_closed("envoy.filters.http.rbac", ""));
        assert!(filter_fails_closed(
            "anything",
            "envoy.extensions.filters.http.oauth2.v3.OAuth2"
        ));
        assert!(filter_fails_closed(
            "envoy.filters.network.local_ratelimit",
            "envoy.extensions.filters.network.local_ratelimit.v3.LocalRateLimit"
        ));
        assert!(filter_fails_closed("istio_authn", ""));
        assert!(filter_fails_closed("envoy.filters.http.lua", ""));
        assert!(filter_fails_closed(
            "",
            "envoy.extensions.filters.listener.local_ratelimit.v3.LocalRateLimit"
        ));
        assert!(filter_fails_closed("envoy.filters.http.golang", ""));
        assert!(filter_fails_closed(
            "envoy.filters.network.set_filter_state",
            "envoy.extensions.filters.network.set_filter_state.v3.Config"
        ));
    }

    #[test]
    fn filters_without_security_effect_are_skipped() {
        for (name, ty) in [
            (
                "envoy.filters.http.cors",
                "envoy.extensions.filters.http.cors.v3.Cors",
            ),
            ("envoy.filters.http.fault", ""),
            ("istio.stats", "stats.PluginConfig"),
            ("istio.metadata_exchange", ""),
            ("envoy.filters.http.grpc_json_transcoder", ""),
            ("set_authority", ""),
        ] {
            assert!(!filter_fails_closed(name, ty), "{name}");
        }
    }
}
