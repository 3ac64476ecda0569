//! Envoy's tag extraction: splitting a stat name such as `cluster.web.upstream_rq_200` into a
//! tag-extracted name (`cluster.upstream_rq`) and tags (`envoy.cluster_name="web"`,
//! `envoy.response_code="200"`), which `/stats/prometheus` turns into a metric and its labels.
//!
//! The rules are Envoy's default tag specifiers for the stat families revoy emits, plus a
//! bootstrap's `stats_config.stats_tags` (Istio replaces the defaults with its own). Each
//! extractor looks at the whole original name; the parts they capture are removed at the end.
//! Extractors whose pattern starts with a fixed first token only run on names with that token,
//! after the others, which fixes the order of the tags as Envoy orders them.

use regex::Regex;

/// One way to find a tag in a stat name.
#[derive(Debug)]
enum Rule {
    /// A regex: group 1 is removed from the name, group 2 (else group 1) is the value. It runs
    /// only on names containing `substr`; a value equal to `unless` is no match.
    Regex {
        re: Regex,
        substr: &'static str,
        unless: Option<&'static str>,
    },
    /// Dot-separated tokens: a literal, `*` (one token), `**` (any number of tokens) or `$`
    /// (one token, the value; it is removed with its following dot).
    Tokens(Vec<String>),
    /// A fixed value added to every stat.
    Fixed(String),
}

/// A named tag extractor.
#[derive(Debug)]
struct Extractor {
    name: String,
    /// The first token a name must have for the extractor to run.
    prefix: Option<String>,
    rule: Rule,
}

/// Produces the tags of stat names, like Envoy's `TagProducer`.
#[derive(Debug)]
pub struct TagProducer {
    extractors: Vec<Extractor>,
}

/// A tag specifier revoy cannot compile.
#[derive(Debug, thiserror::Error)]
#[error("stats tag '{name}': {reason}")]
pub struct TagError {
    /// The tag's name.
    pub name: String,
    /// What is wrong.
    pub reason: String,
}

// ASCII classes (`[0-9]`, not `\d`): Unicode classes make compiled regexes much larger.
const TAG_VALUE: &str = r"[^\.]+";
const ADDRESS: &str =
    r"(?:(?:[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}|\[[a-fA-F_0-9]+\])_[0-9]+)";

/// A bootstrap `stats_config.stats_tags` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TagSpec {
    /// `regex`: group 1 is removed, group 2 (else 1) is the value.
    Regex(String),
    /// `fixed_value`: added to every stat.
    Fixed(String),
    /// Neither: Envoy's default rule of that name.
    Default,
}

/// A bootstrap's tag rules, compiled the first time `/stats/prometheus` needs them (so a
/// proxy nobody scrapes does not hold the compiled regexes).
#[derive(Debug)]
pub struct StatsTags {
    use_defaults: bool,
    specs: Vec<(String, TagSpec)>,
    producer: std::sync::OnceLock<TagProducer>,
}

impl StatsTags {
    /// Rules already checked to compile (see [`TagProducer::with`]).
    pub fn new(use_defaults: bool, specs: Vec<(String, TagSpec)>) -> Self {
        StatsTags {
            use_defaults,
            specs,
            producer: std::sync::OnceLock::new(),
        }
    }

    /// The compiled rules.
    pub fn producer(&self) -> &TagProducer {
        self.producer.get_or_init(|| {
            TagProducer::with(self.use_defaults, &self.specs)
                .expect("each custom tag rule compiled when the bootstrap was compiled")
        })
    }
}

impl Default for TagProducer {
    fn default() -> Self {
        Self::with(true, &[]).expect("the default tag rules compile")
    }
}

impl TagProducer {
    /// Envoy's default extractors (when `use_defaults`), then the `custom` ones.
    pub fn with(use_defaults: bool, custom: &[(String, TagSpec)]) -> Result<Self, TagError> {
        let mut extractors = Vec::new();
        if use_defaults {
            for (name, rule) in default_rules() {
                extractors.push(extractor(name.to_owned(), rule));
            }
        }
        for (name, spec) in custom {
            match spec {
                TagSpec::Regex(regex) => extractors.push(Extractor {
                    name: name.clone(),
                    prefix: regex_prefix(regex),
                    rule: Rule::Regex {
                        re: compile(name, regex)?,
                        substr: "",
                        unless: None,
                    },
                }),
                TagSpec::Fixed(value) => extractors.push(Extractor {
                    name: name.clone(),
                    prefix: None,
                    rule: Rule::Fixed(value.clone()),
                }),
                TagSpec::Default => {
                    let rules: Vec<_> = default_rules()
                        .into_iter()
                        .filter(|(n, _)| n == name)
                        .collect();
                    if rules.is_empty() {
                        return Err(TagError {
                            name: name.clone(),
                            reason: "no regex or fixed_value, and no default rule has this name"
                                .into(),
                        });
                    }
                    if !use_defaults {
                        for (n, rule) in rules {
                            extractors.push(extractor(n.to_owned(), rule));
                        }
                    }
                }
            }
        }
        Ok(TagProducer { extractors })
    }

    /// The tag-extracted name of `stat` and its tags, in Envoy's order.
    pub fn produce(&self, stat: &str) -> (String, Vec<(&str, String)>) {
        let first = stat.split('.').next().filter(|_| stat.contains('.'));
        let mut tags = Vec::new();
        let mut removed: Vec<(usize, usize)> = Vec::new();
        let unprefixed = self.extractors.iter().filter(|e| e.prefix.is_none());
        let prefixed = self
            .extractors
            .iter()
            .filter(|e| e.prefix.is_some() && e.prefix.as_deref() == first);
        for e in unprefixed.chain(prefixed) {
            if let Some((value, range)) = e.rule.extract(stat) {
                tags.push((e.name.as_str(), value));
                if let Some(r) = range {
                    removed.push(r);
                }
            }
        }
        removed.sort_unstable();
        let mut name = String::with_capacity(stat.len());
        let mut at = 0;
        for (start, end) in removed {
            if start > at {
                name.push_str(&stat[at..start]);
            }
            at = at.max(end);
        }
        name.push_str(&stat[at.min(stat.len())..]);
        (name, tags)
    }
}

impl Rule {
    /// The value and the byte range to remove, when the rule matches `stat`.
    fn extract(&self, stat: &str) -> Option<(String, Option<(usize, usize)>)> {
        match self {
            Rule::Fixed(v) => Some((v.clone(), None)),
            Rule::Regex { re, substr, unless } => {
                if !substr.is_empty() && !stat.contains(substr) {
                    return None;
                }
                let caps = re.captures(stat)?;
                let remove = caps.get(1)?;
                let value = caps.get(2).unwrap_or(remove).as_str();
                if unless.is_some_and(|u| u == value) {
                    return None;
                }
                Some((value.to_owned(), Some((remove.start(), remove.end()))))
            }
            Rule::Tokens(pattern) => {
                let tokens: Vec<&str> = stat.split('.').collect();
                let at = match_tokens(pattern, &tokens)?;
                let start: usize = tokens[..at].iter().map(|t| t.len() + 1).sum();
                let value = tokens[at];
                let end = (start + value.len() + 1).min(stat.len());
                (!value.is_empty()).then(|| (value.to_owned(), Some((start, end))))
            }
        }
    }
}

/// Matches `tokens` against `pattern`; returns the index of the `$` token.
fn match_tokens(pattern: &[String], tokens: &[&str]) -> Option<usize> {
    fn go(p: &[String], t: &[&str], offset: usize, value: Option<usize>) -> Option<Option<usize>> {
        match p.split_first() {
            None => t.is_empty().then_some(value),
            Some((first, rest)) if first == "**" => {
                (0..=t.len()).find_map(|skip| go(rest, &t[skip..], offset + skip, value))
            }
            Some((first, rest)) => {
                let (token, others) = t.split_first()?;
                let value = match first.as_str() {
                    "$" => Some(offset),
                    "*" => value,
                    literal if literal == *token => value,
                    _ => return None,
                };
                go(rest, others, offset + 1, value)
            }
        }
    }
    go(pattern, tokens, 0, None)?
}

fn extractor(name: String, rule: Rule) -> Extractor {
    let prefix = match &rule {
        Rule::Tokens(t) => t
            .first()
            .filter(|f| !matches!(f.as_str(), "$" | "*" | "**"))
            .cloned(),
        Rule::Regex { re, .. } => regex_prefix(re.as_str()),
        Rule::Fixed(_) => None,
    };
    Extractor { name, prefix, rule }
}

/// Envoy's fixed first token of a regex: `^name` followed by `\.` (or a lookahead of one).
fn regex_prefix(regex: &str) -> Option<String> {
    let rest = regex.strip_prefix('^')?;
    let len = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    let after = &rest[len..];
    (len > 0 && (after.starts_with(r"\.") || after.starts_with(r"(?=\.)")))
        .then(|| rest[..len].to_owned())
}

/// Compiles a custom tag regex. Envoy's regexes are ECMAScript; the one construct of them that
/// the `regex` crate lacks and tag specifiers use, a `(?=\.)` lookahead before `.*?`, is
/// rewritten to the equivalent `(?:\..*?)?`.
fn compile(name: &str, regex: &str) -> Result<Regex, TagError> {
    let rewritten = regex
        .replace(r"(?=\.).*?\.", r"(?:\..*?)?\.")
        .replace(r"(?=\.).*\.", r"(?:\..*)?\.");
    Regex::new(&rewritten).map_err(|e| TagError {
        name: name.to_owned(),
        reason: format!("regex {regex:?} is not supported: {e}"),
    })
}

fn tokens(pattern: &str) -> Rule {
    Rule::Tokens(pattern.split('.').map(str::to_owned).collect())
}

fn regex(re: &str, substr: &'static str) -> Rule {
    regex_unless(re, substr, None)
}

/// A default regex rule (placeholders expanded) that does not match when its value is
/// `unless`.
fn regex_unless(re: &str, substr: &'static str, unless: Option<&'static str>) -> Rule {
    let re = re
        .replace("<TAG_VALUE>", TAG_VALUE)
        .replace("<ADDRESS>", ADDRESS);
    Rule::Regex {
        re: Regex::new(&re).expect("default tag regex"),
        substr,
        unless,
    }
}

/// Envoy 1.40's default tag specifiers for the stat families revoy emits (clusters,
/// connection managers, listeners, tcp_proxy, virtual hosts, workers), in the order Envoy
/// applies them: its regex descriptors, then its tokenized ones (so a stat both kinds tag,
/// `http.<prefix>.rds.<name>.*`, lists its route configuration first), each kind in the
/// order of Envoy's list.
fn default_rules() -> Vec<(&'static str, Rule)> {
    let mut rules = envoys_list();
    rules.sort_by_key(|(_, rule)| matches!(rule, Rule::Tokens(_)));
    rules
}

/// Envoy's default tag specifiers as its list names them, both kinds together.
fn envoys_list() -> Vec<(&'static str, Rule)> {
    vec![
        ("envoy.response_code", regex(r"_rq(_([0-9]{3}))$", "_rq_")),
        (
            "envoy.response_code_class",
            regex(r"_rq_(([0-9]))xx$", "_rq_"),
        ),
        ("envoy.virtual_cluster", tokens("vhost.*.vcluster.$.**")),
        ("envoy.tcp_prefix", tokens("tcp.$.**")),
        ("envoy.cluster_name", tokens("cluster.$.**")),
        (
            "envoy.http_conn_manager_prefix",
            regex(r"^listener\..*?\.http\.((<TAG_VALUE>)\.)", ".http."),
        ),
        ("envoy.http_conn_manager_prefix", tokens("http.$.**")),
        (
            "envoy.worker_id",
            regex(
                r"^(?:listener\.(?:<ADDRESS>|<TAG_VALUE>)\.|server\.|listener_manager\.)worker_(([0-9]+)\.)",
                "",
            ),
        ),
        (
            "envoy.listener_address",
            regex_unless(r"^listener\.((<ADDRESS>|<TAG_VALUE>)\.)", "", Some("admin")),
        ),
        ("envoy.virtual_host", tokens("vhost.$.**")),
        (
            "envoy.rds_route_config",
            regex(
                r"^http\.<TAG_VALUE>\.rds\.(([0-9A-Za-z_\-.]+)\.)[0-9A-Za-z_]+?$",
                ".rds.",
            ),
        ),
        ("envoy.route", tokens("vhost.*.route.$.**")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(p: &TagProducer, stat: &str) -> (String, Vec<(String, String)>) {
        let (name, tags) = p.produce(stat);
        (
            name,
            tags.into_iter().map(|(n, v)| (n.to_owned(), v)).collect(),
        )
    }

    fn t(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn default_rules_split_cluster_http_listener_and_tcp_stats() {
        let p = TagProducer::default();
        assert_eq!(
            tags(&p, "cluster.web.upstream_rq_200"),
            (
                "cluster.upstream_rq".into(),
                t(&[
                    ("envoy.response_code", "200"),
                    ("envoy.cluster_name", "web")
                ])
            )
        );
        assert_eq!(
            tags(&p, "http.ingress.downstream_rq_2xx"),
            (
                "http.downstream_rq_xx".into(),
                t(&[
                    ("envoy.response_code_class", "2"),
                    ("envoy.http_conn_manager_prefix", "ingress")
                ])
            )
        );
        assert_eq!(
            tags(&p, "listener.127.0.0.1_10000.downstream_cx_total"),
            (
                "listener.downstream_cx_total".into(),
                t(&[("envoy.listener_address", "127.0.0.1_10000")])
            )
        );
        assert_eq!(
            tags(&p, "listener.admin.downstream_cx_total").1,
            Vec::<(String, String)>::new()
        );
        assert_eq!(
            tags(&p, "tcp.ingress_tcp.downstream_cx_total"),
            (
                "tcp.downstream_cx_total".into(),
                t(&[("envoy.tcp_prefix", "ingress_tcp")])
            )
        );
        assert_eq!(tags(&p, "server.live"), ("server.live".into(), vec![]));
        // Envoy applies its regex rules before its token rules (Envoy 1.40's Prometheus
        // output lists `envoy_rds_route_config` first).
        assert_eq!(
            tags(&p, "http.main.rds.routes.version_text"),
            (
                "http.rds.version_text".into(),
                t(&[
                    ("envoy.rds_route_config", "routes"),
                    ("envoy.http_conn_manager_prefix", "main")
                ])
            )
        );
    }

    #[test]
    fn istio_rules_replace_the_defaults_and_lookaheads_are_rewritten() {
        let custom = vec![
            (
                "cluster_name".to_owned(),
                TagSpec::Regex(r"^cluster\.((.+?(\..+?\.svc\.cluster\.local)?)\.)".to_owned()),
            ),
            (
                "http_conn_manager_listener_prefix".to_owned(),
                TagSpec::Regex(
                    r"^listener(?=\.).*?\.http\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)"
                        .to_owned(),
                ),
            ),
            ("mesh".to_owned(), TagSpec::Fixed("m1".to_owned())),
        ];
        let p = TagProducer::with(false, &custom).unwrap();
        assert_eq!(
            tags(
                &p,
                "cluster.outbound|80||web.ns.svc.cluster.local.upstream_cx_total"
            ),
            (
                "cluster.upstream_cx_total".into(),
                t(&[
                    ("mesh", "m1"),
                    ("cluster_name", "outbound|80||web.ns.svc.cluster.local")
                ])
            )
        );
        assert_eq!(
            tags(
                &p,
                "listener.0.0.0.0_15006.http.127.0.0.1_80.downstream_rq_total"
            ),
            (
                "listener.0.0.0.0_15006.http.downstream_rq_total".into(),
                t(&[
                    ("mesh", "m1"),
                    ("http_conn_manager_listener_prefix", "127.0.0.1_80")
                ])
            )
        );
        assert!(
            TagProducer::with(false, &[("bad".into(), TagSpec::Regex("(?<=x)".into()))]).is_err()
        );
        assert!(TagProducer::with(false, &[("nameless".into(), TagSpec::Default)]).is_err());
    }
}
