//! `rate_limits` of a route action or virtual host -> [`RateLimitPolicy`] list. Action kinds
//! and fields revoy does not implement are errors naming them: a rate limit whose descriptors
//! came out differently than in Envoy would let through what Envoy limits.

use proto::pb::envoy::config::route::v3 as pb;
use proto::pb::envoy::config::route::v3::rate_limit::action::ActionSpecifier as A;

use super::matchers::{header_matchers, string_matcher};
use crate::config::{ConfigError, Context};
use crate::route::matcher::QueryParameterMatcher;
use crate::route::rate_limit::{MAX_STAGE, RateLimitAction, RateLimitPolicy, RequestMatchers};

/// Compiles a `rate_limits` list; errors name the entry (`[i]...`).
pub fn compile_rate_limits(
    ctx: &Context<'_>,
    limits: &[pb::RateLimit],
) -> Result<Vec<RateLimitPolicy>, ConfigError> {
    limits
        .iter()
        .enumerate()
        .map(|(i, l)| compile_policy(ctx, l).map_err(|e| e.within(&format!("[{i}]"))))
        .collect()
}

fn compile_policy(ctx: &Context<'_>, l: &pb::RateLimit) -> Result<RateLimitPolicy, ConfigError> {
    let stage = l.stage.map_or(0, |s| s.value);
    if stage > MAX_STAGE {
        return Err(ConfigError::new(
            "stage",
            format!("value must be less than or equal to {MAX_STAGE}"),
        ));
    }
    if l.actions.is_empty() {
        return Err(ConfigError::new(
            "actions",
            "value must contain at least 1 item(s)",
        ));
    }
    if l.limit.is_some() {
        return Err(ConfigError::unimplemented(
            "limit",
            "a rate limit override (limit)",
        ));
    }
    if l.hits_addend.is_some() {
        return Err(ConfigError::unimplemented("hits_addend", "hits_addend"));
    }
    if l.apply_on_stream_done {
        return Err(ConfigError::unimplemented(
            "apply_on_stream_done",
            "apply_on_stream_done",
        ));
    }
    if l.x_ratelimit_option != 0 {
        return Err(ConfigError::unimplemented(
            "x_ratelimit_option",
            "a rate limit's own x_ratelimit_option",
        ));
    }
    let actions = l
        .actions
        .iter()
        .enumerate()
        .map(|(i, a)| compile_action(ctx, a).map_err(|e| e.within(&format!("actions[{i}]"))))
        .collect::<Result<_, _>>()?;
    Ok(RateLimitPolicy {
        stage,
        disable_key: l.disable_key.clone(),
        actions,
    })
}

fn or_default(key: &str, default: &str) -> String {
    if key.is_empty() { default } else { key }.to_owned()
}

fn required(value: &str, path: &str) -> Result<(), ConfigError> {
    if value.is_empty() {
        return Err(ConfigError::new(
            path,
            "value length must be at least 1 characters",
        ));
    }
    Ok(())
}

fn no_default_value(default_value: &str, path: &str) -> Result<(), ConfigError> {
    if !default_value.is_empty() {
        return Err(ConfigError::unimplemented(
            format!("{path}.default_value"),
            "default_value",
        ));
    }
    Ok(())
}

#[allow(deprecated)] // The deprecated `dynamic_metadata` action is still served, as by Envoy.
fn compile_action(
    ctx: &Context<'_>,
    a: &pb::rate_limit::Action,
) -> Result<RateLimitAction, ConfigError> {
    Ok(match &a.action_specifier {
        None => return Err(ConfigError::new("action_specifier", "value is required")),
        Some(A::SourceCluster(_)) => RateLimitAction::SourceCluster,
        Some(A::DestinationCluster(_)) => RateLimitAction::DestinationCluster,
        Some(A::RequestHeaders(h)) => {
            required(&h.header_name, "request_headers.header_name")?;
            required(&h.descriptor_key, "request_headers.descriptor_key")?;
            RateLimitAction::RequestHeaders {
                name: h.header_name.to_ascii_lowercase(),
                key: h.descriptor_key.clone(),
                skip_if_absent: h.skip_if_absent,
            }
        }
        Some(A::QueryParameters(q)) => {
            required(
                &q.query_parameter_name,
                "query_parameters.query_parameter_name",
            )?;
            required(&q.descriptor_key, "query_parameters.descriptor_key")?;
            RateLimitAction::QueryParameters {
                name: q.query_parameter_name.clone(),
                key: q.descriptor_key.clone(),
                skip_if_absent: q.skip_if_absent,
            }
        }
        Some(A::RemoteAddress(_)) => RateLimitAction::RemoteAddress,
        Some(A::MaskedRemoteAddress(m)) => {
            let v4 = m.v4_prefix_mask_len.map_or(32, |v| v.value);
            let v6 = m.v6_prefix_mask_len.map_or(128, |v| v.value);
            if v4 > 32 {
                return Err(ConfigError::new(
                    "masked_remote_address.v4_prefix_mask_len",
                    "value must be less than or equal to 32",
                ));
            }
            if v6 > 128 {
                return Err(ConfigError::new(
                    "masked_remote_address.v6_prefix_mask_len",
                    "value must be less than or equal to 128",
                ));
            }
            RateLimitAction::MaskedRemoteAddress {
                v4: v4 as u8,
                v6: v6 as u8,
            }
        }
        Some(A::GenericKey(g)) => {
            required(&g.descriptor_value, "generic_key.descriptor_value")?;
            no_default_value(&g.default_value, "generic_key")?;
            RateLimitAction::GenericKey {
                key: or_default(&g.descriptor_key, "generic_key"),
                value: g.descriptor_value.clone(),
            }
        }
        Some(A::HeaderValueMatch(h)) => {
            required(&h.descriptor_value, "header_value_match.descriptor_value")?;
            no_default_value(&h.default_value, "header_value_match")?;
            if h.headers.is_empty() {
                return Err(ConfigError::new(
                    "header_value_match.headers",
                    "value must contain at least 1 item(s)",
                ));
            }
            RateLimitAction::ValueMatch {
                key: or_default(&h.descriptor_key, "header_match"),
                value: h.descriptor_value.clone(),
                expect_match: h.expect_match.is_none_or(|b| b.value),
                matchers: RequestMatchers::Headers(
                    header_matchers(ctx, &h.headers).map_err(|e| e.within("header_value_match"))?,
                ),
            }
        }
        Some(A::QueryParameterValueMatch(q)) => {
            let at = "query_parameter_value_match";
            required(&q.descriptor_value, &format!("{at}.descriptor_value"))?;
            no_default_value(&q.default_value, at)?;
            if q.query_parameters.is_empty() {
                return Err(ConfigError::new(
                    format!("{at}.query_parameters"),
                    "value must contain at least 1 item(s)",
                ));
            }
            let parameters = q
                .query_parameters
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    use pb::query_parameter_matcher::QueryParameterMatchSpecifier as Q;
                    let value = match &p.query_parameter_match_specifier {
                        Some(Q::StringMatch(s)) => Some(string_matcher(ctx, s).map_err(|e| {
                            e.within(&format!("{at}.query_parameters[{i}].string_match"))
                        })?),
                        Some(Q::PresentMatch(_)) | None => None,
                    };
                    Ok(QueryParameterMatcher {
                        name: p.name.clone(),
                        value,
                    })
                })
                .collect::<Result<_, ConfigError>>()?;
            RateLimitAction::ValueMatch {
                key: or_default(&q.descriptor_key, "query_match"),
                value: q.descriptor_value.clone(),
                expect_match: q.expect_match.is_none_or(|b| b.value),
                matchers: RequestMatchers::QueryParameters(parameters),
            }
        }
        Some(A::DynamicMetadata(d)) => metadata_action(
            &d.descriptor_key,
            d.metadata_key.as_ref(),
            &d.default_value,
            false,
        )
        .map_err(|e| e.within("dynamic_metadata"))?,
        Some(A::Metadata(m)) => {
            use pb::rate_limit::action::meta_data::Source;
            if m.source != Source::Dynamic as i32 {
                return Err(ConfigError::unimplemented(
                    "metadata.source",
                    "the metadata action's route and cluster metadata sources",
                ));
            }
            metadata_action(
                &m.descriptor_key,
                m.metadata_key.as_ref(),
                &m.default_value,
                m.skip_if_absent,
            )
            .map_err(|e| e.within("metadata"))?
        }
        Some(A::Extension(e)) => {
            return Err(ConfigError::unimplemented(
                "extension",
                &format!("the rate limit descriptor extension '{}'", e.name),
            ));
        }
        Some(A::RemoteAddressMatch(_)) => {
            return Err(ConfigError::unimplemented(
                "remote_address_match",
                "the remote_address_match action",
            ));
        }
    })
}

/// The `dynamic_metadata` and `metadata` (dynamic source) actions: a string in the request's
/// dynamic metadata, else `default_value`, else nothing (`skip_if_absent`: the entry is left
/// out, otherwise no descriptor).
fn metadata_action(
    descriptor_key: &str,
    key: Option<&proto::pb::envoy::r#type::metadata::v3::MetadataKey>,
    default_value: &str,
    skip_if_absent: bool,
) -> Result<RateLimitAction, ConfigError> {
    use proto::pb::envoy::r#type::metadata::v3::metadata_key::path_segment::Segment;
    required(descriptor_key, "descriptor_key")?;
    let key = key.ok_or_else(|| ConfigError::new("metadata_key", "value is required"))?;
    required(&key.key, "metadata_key.key")?;
    if key.path.is_empty() {
        return Err(ConfigError::new(
            "metadata_key.path",
            "value must contain at least 1 item(s)",
        ));
    }
    let path = key
        .path
        .iter()
        .enumerate()
        .map(|(i, p)| match &p.segment {
            Some(Segment::Key(k)) if !k.is_empty() => Ok(k.clone()),
            Some(Segment::Key(_)) => Err(ConfigError::new(
                format!("metadata_key.path[{i}].key"),
                "value length must be at least 1 characters",
            )),
            Some(Segment::Index(_)) => Err(ConfigError::unimplemented(
                format!("metadata_key.path[{i}].index"),
                "list indexes in metadata keys",
            )),
            None => Err(ConfigError::new(
                format!("metadata_key.path[{i}].segment"),
                "value is required",
            )),
        })
        .collect::<Result<_, _>>()?;
    Ok(RateLimitAction::DynamicMetadata {
        key: descriptor_key.to_owned(),
        namespace: key.key.clone(),
        path,
        default_value: default_value.to_owned(),
        skip_if_absent,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compile(yaml: &str) -> Result<Vec<RateLimitPolicy>, ConfigError> {
        let codec = proto::Codec::new();
        let value = proto::Codec::parse_text(yaml, proto::Format::Yaml).unwrap();
        let vh: pb::VirtualHost = codec.decode(value, false).unwrap().message;
        let io = crate::config::FakeIo::new();
        compile_rate_limits(&Context::new(&io), &vh.rate_limits)
    }

    #[test]
    fn metadata_actions_read_dynamic_metadata_only() {
        let p = compile(
            "{name: v, domains: ['*'], rate_limits: [{actions: [\
             {dynamic_metadata: {descriptor_key: u, metadata_key: {key: ns, path: [{key: a}, {key: b}]}, default_value: d}}, \
             {metadata: {descriptor_key: r, metadata_key: {key: ns, path: [{key: r}]}, skip_if_absent: true}}]}]}",
        )
        .unwrap();
        match &p[0].actions[..] {
            [
                RateLimitAction::DynamicMetadata {
                    key,
                    path,
                    default_value,
                    skip_if_absent: false,
                    ..
                },
                RateLimitAction::DynamicMetadata {
                    skip_if_absent: true,
                    ..
                },
            ] => assert_eq!(
                (key.as_str(), &path[..], default_value.as_str()),
                ("u", &["a".to_owned(), "b".to_owned()][..], "d")
            ),
            other => panic!("{other:?}"),
        }
        let e = compile(
            "{name: v, domains: ['*'], rate_limits: [{actions: [\
             {metadata: {descriptor_key: r, metadata_key: {key: ns, path: [{key: r}]}, source: ROUTE_ENTRY}}]}]}",
        )
        .unwrap_err();
        assert!(e.path.ends_with("metadata.source"), "{e:?}");
        let e = compile(
            "{name: v, domains: ['*'], rate_limits: [{actions: [\
             {metadata: {descriptor_key: r, metadata_key: {key: ns}}}]}]}",
        )
        .unwrap_err();
        assert!(e.path.ends_with("metadata.metadata_key.path"), "{e:?}");
    }

    #[test]
    fn actions_compile_with_envoys_defaults() {
        let p = compile(
            "{name: v, domains: ['*'], rate_limits: [{stage: 2, disable_key: d, actions: [\
             {generic_key: {descriptor_value: g}}, \
             {header_value_match: {descriptor_value: m, headers: [{name: X-A, present_match: true}]}}, \
             {masked_remote_address: {v4_prefix_mask_len: 24}}, \
             {request_headers: {header_name: X-User, descriptor_key: user}}]}]}",
        )
        .unwrap();
        assert_eq!((p[0].stage, p[0].disable_key.as_str()), (2, "d"));
        match &p[0].actions[..] {
            [
                RateLimitAction::GenericKey { key, .. },
                RateLimitAction::ValueMatch {
                    key: match_key,
                    expect_match: true,
                    ..
                },
                RateLimitAction::MaskedRemoteAddress { v4: 24, v6: 128 },
                RateLimitAction::RequestHeaders { name, .. },
            ] => {
                assert_eq!(key, "generic_key");
                assert_eq!(match_key, "header_match");
                assert_eq!(name, "x-user");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unimplemented_actions_and_bad_fields_are_named() {
        let e = compile(
            "{name: v, domains: ['*'], rate_limits: [{actions: [{source_cluster: {}}, \
             {remote_address_match: {address_matcher: {}}}]}]}",
        )
        .unwrap_err();
        assert_eq!(e.path, "[0].actions[1].remote_address_match");
        assert!(e.message.contains("not implemented"), "{e}");
        let e = compile("{name: v, domains: ['*'], rate_limits: [{stage: 11, actions: [{remote_address: {}}]}]}")
            .unwrap_err();
        assert_eq!(e.path, "[0].stage");
        let e = compile("{name: v, domains: ['*'], rate_limits: [{actions: []}]}").unwrap_err();
        assert_eq!(e.path, "[0].actions");
    }
}
