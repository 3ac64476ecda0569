//! istio-init's iptables rules, from Istio's own goldens (`tests/data/istio-iptables/`, see
//! `tests/data/PROVENANCE.md`): each golden is what `pilot-agent istio-iptables` writes for one
//! set of flags. A pod's rule set is one golden's IPv4 tables, plus, for a flag that golden
//! was not made with, the exact lines another golden shows that flag adds, with the golden's
//! example addresses and ports rewritten to the test's own. Every line applied is checked to
//! appear in a golden (after the rewrite), so nothing here is invented.
//!
//! A dual-stack pod (istio-init with IPv6 enabled) gets the same IPv4 tables and, through
//! `ip6tables-restore`, the IPv6 table of [`IPV6_BASE`] plus the same flags' lines: the lines
//! `-b '*'` and `-i '*'` add name no address, and istio-init adds them to both families alike
//! (`AppendRule`, not `AppendVersionedRule`, in `tools/istio-iptables/pkg/capture/run.go`).

use std::io::Write;
use std::process::{Command, Stdio};

/// The goldens, by file name.
const GOLDENS: &[(&str, &str)] = &[
    (
        "inbound-ports-wildcard",
        include_str!("../data/istio-iptables/inbound-ports-wildcard.golden"),
    ),
    (
        "kube-virt-interfaces",
        include_str!("../data/istio-iptables/kube-virt-interfaces.golden"),
    ),
    (
        "inbound-ports-include",
        include_str!("../data/istio-iptables/inbound-ports-include.golden"),
    ),
    (
        "ip-range",
        include_str!("../data/istio-iptables/ip-range.golden"),
    ),
    (
        "inbound-ports-wildcard-tproxy",
        include_str!("../data/istio-iptables/inbound-ports-wildcard-tproxy.golden"),
    ),
    (
        IPV6_BASE,
        include_str!("../data/istio-iptables/ipv6-empty-inbound-ports.golden"),
    ),
];

/// The golden a dual-stack pod's IPv6 table starts from: istio-init with IPv6 enabled and no
/// inbound ports (`-b ''`), whose IPv6 table has the chains, the `::6` and `::1` exemptions and
/// no capture yet.
const IPV6_BASE: &str = "ipv6-empty-inbound-ports";

/// `-b '*'` (capture every inbound port, REDIRECT): the lines `inbound-ports-wildcard.golden`
/// (made with `-b '*'`) has and `ipv6-empty-inbound-ports.golden`'s tables (made with `-b ''`)
/// lack.
const INBOUND_ALL: (&str, [&str; 2]) = (
    "inbound-ports-wildcard",
    [
        "-A PREROUTING -p tcp -j ISTIO_INBOUND",
        "-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT",
    ],
);

/// `-i '*'` (capture all outbound traffic): the line `kube-virt-interfaces.golden` (made with
/// `-i '*'`) has and `inbound-ports-wildcard.golden` (made without `-i`) lacks.
const OUTBOUND_ALL: (&str, &str) = ("kube-virt-interfaces", "-A ISTIO_OUTPUT -j ISTIO_REDIRECT");

/// A pod's capture mode, as istio-init's flags set it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capture {
    /// The injector's defaults: `-m REDIRECT -b '*' -i '*'`:
    /// `inbound-ports-wildcard.golden` plus [`OUTBOUND_ALL`].
    Redirect,
    /// `-m REDIRECT -b <ports> -i <cidr> -x <cidr>`: `inbound-ports-include.golden` (`-b
    /// 32000,31000`, the ports kept, so pods using it serve on them) plus the two `ISTIO_OUTPUT`
    /// lines of `ip-range.golden` (`-i 9.9.0.0/16 -x 1.1.0.0/16`), the CIDRs rewritten to the
    /// test's service range (captured) and its "external" range (excluded).
    PortsAndRanges,
    /// `-m TPROXY -b '*' -i '*'`: `inbound-ports-wildcard-tproxy.golden` plus [`OUTBOUND_ALL`].
    Tproxy,
}

/// What [`Capture::PortsAndRanges`] rewrites in `ip-range.golden`'s lines: its included CIDR
/// becomes the services' range, its excluded one the range of hosts outside the mesh.
pub fn ranges_rewrite(services: &str, outside: &str) -> [(String, String); 2] {
    [
        ("9.9.0.0/16".to_owned(), services.to_owned()),
        ("1.1.0.0/16".to_owned(), outside.to_owned()),
    ]
}

/// An IP family, whose tables a golden lists in turn (IPv4's first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `iptables`.
    V4,
    /// `ip6tables`.
    V6,
}

/// The tables of `family` in the golden `name`, as `(table, lines)`, in order (a golden lists
/// the IPv4 tables first, then the IPv6 ones, which start when a table name comes again).
fn tables(name: &str, family: Family) -> Vec<(String, Vec<String>)> {
    let text = GOLDENS
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no golden {name}"))
        .1;
    let mut v4: Vec<(String, Vec<String>)> = Vec::new();
    let mut v6: Vec<(String, Vec<String>)> = Vec::new();
    for line in text.lines() {
        if let Some(table) = line.strip_prefix("* ") {
            let seen = v4.iter().any(|(t, _)| t == table);
            let tables = if seen || !v6.is_empty() {
                &mut v6
            } else {
                &mut v4
            };
            tables.push((table.to_owned(), Vec::new()));
        } else if line.starts_with('-') {
            let tables = if v6.is_empty() { &mut v4 } else { &mut v6 };
            if let Some((_, lines)) = tables.last_mut() {
                lines.push(line.to_owned());
            }
        }
    }
    match family {
        Family::V4 => v4,
        Family::V6 => v6,
    }
}

/// The line `line` of the golden `name`'s IPv4 tables, which must be there: `(table, line)`.
fn golden_line(name: &str, line: &str) -> (String, String) {
    let found = tables(name, Family::V4)
        .into_iter()
        .find(|(_, lines)| lines.iter().any(|l| l == line));
    let (table, _) = found.unwrap_or_else(|| panic!("{name}.golden has no line `{line}`"));
    (table, line.to_owned())
}

/// The IPv4 rules of `capture`: `(table, lines)` in the order istio-init applies them.
/// `ranges` is [`ranges_rewrite`]'s pairs, used by [`Capture::PortsAndRanges`].
pub fn rules(capture: Capture, ranges: &[(String, String)]) -> Vec<(String, Vec<String>)> {
    let (base, extra): (&str, Vec<(String, String)>) = match capture {
        Capture::Redirect => (
            "inbound-ports-wildcard",
            vec![golden_line(OUTBOUND_ALL.0, OUTBOUND_ALL.1)],
        ),
        Capture::Tproxy => (
            "inbound-ports-wildcard-tproxy",
            vec![golden_line(OUTBOUND_ALL.0, OUTBOUND_ALL.1)],
        ),
        Capture::PortsAndRanges => (
            "inbound-ports-include",
            [
                "-A ISTIO_OUTPUT -d 1.1.0.0/16 -j RETURN",
                "-A ISTIO_OUTPUT -d 9.9.0.0/16 -j ISTIO_REDIRECT",
            ]
            .into_iter()
            .map(|l| golden_line("ip-range", l))
            .map(|(table, line)| {
                let line = ranges
                    .iter()
                    .fold(line, |l, (from, to)| l.replace(from, to));
                (table, line)
            })
            .collect(),
        ),
    };
    with_lines(base, tables(base, Family::V4), extra)
}

/// `tables` (the golden `base`'s) with `extra` appended to their tables.
fn with_lines(
    base: &str,
    mut tables: Vec<(String, Vec<String>)>,
    extra: Vec<(String, String)>,
) -> Vec<(String, Vec<String>)> {
    for (table, line) in extra {
        let lines = &mut tables
            .iter_mut()
            .find(|(t, _)| *t == table)
            .unwrap_or_else(|| panic!("{base}.golden has no {table} table"))
            .1;
        lines.push(line);
    }
    tables
}

/// The IPv6 rules of a dual-stack pod with the injector's default capture ([`Capture::Redirect`],
/// `-m REDIRECT -b '*' -i '*'`, IPv6 enabled): [`IPV6_BASE`]'s IPv6 table plus
/// [`INBOUND_ALL`] and [`OUTBOUND_ALL`], in the order istio-init appends them.
pub fn ipv6_rules() -> Vec<(String, Vec<String>)> {
    let extra = INBOUND_ALL
        .1
        .iter()
        .map(|l| golden_line(INBOUND_ALL.0, l))
        .chain([golden_line(OUTBOUND_ALL.0, OUTBOUND_ALL.1)])
        .collect();
    with_lines(IPV6_BASE, tables(IPV6_BASE, Family::V6), extra)
}

/// `rules` in `iptables-restore` form (`-N X` as `:X - [0:0]`).
pub fn restore_input(rules: &[(String, Vec<String>)]) -> String {
    let mut out = String::new();
    for (table, lines) in rules {
        out.push_str(&format!("*{table}\n"));
        for line in lines {
            match line.strip_prefix("-N ") {
                Some(chain) => out.push_str(&format!(":{chain} - [0:0]\n")),
                None => {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        out.push_str("COMMIT\n");
    }
    out
}

/// Installs `rules` of `family` in the namespace `netns` (`iptables-restore --noflush`, or
/// `ip6tables-restore`), as istio-init does in the pod's.
pub fn apply(netns: &str, family: Family, rules: &[(String, Vec<String>)]) {
    let restore = match family {
        Family::V4 => "iptables-restore",
        Family::V6 => "ip6tables-restore",
    };
    let mut child = Command::new("ip")
        .args(["netns", "exec", netns, restore, "--noflush"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("iptables-restore starts");
    let input = restore_input(rules);
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write the rules");
    let out = child.wait_with_output().expect("iptables-restore ends");
    assert!(
        out.status.success(),
        "{restore} in {netns}: {}\n{input}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_set_captures_both_ways_as_the_injector_configures() {
        let nat = rules(Capture::Redirect, &[])
            .into_iter()
            .find(|(t, _)| t == "nat")
            .expect("a nat table")
            .1;
        assert!(nat.contains(&"-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT".to_owned()));
        assert_eq!(nat.last().map(String::as_str), Some(OUTBOUND_ALL.1));
    }

    #[test]
    fn the_ipv6_set_exempts_the_inbound_source_and_captures_both_ways() {
        let rules = ipv6_rules();
        assert_eq!(rules.len(), 1, "{rules:?}");
        let (table, nat) = &rules[0];
        assert_eq!(table, "nat");
        // IPv6 addresses only, and the exemption of InboundPassthroughCluster's `::6`.
        assert!(nat.iter().all(|l| !l.contains("127.0.0.")), "{nat:?}");
        assert!(nat.contains(&"-A ISTIO_OUTPUT -o lo -s ::6/128 -j RETURN".to_owned()));
        for line in INBOUND_ALL.1 {
            assert!(nat.contains(&line.to_owned()), "{line}");
        }
        assert_eq!(nat.last().map(String::as_str), Some(OUTBOUND_ALL.1));
        // The IPv4 tables of the same golden are not taken for IPv6.
        assert_ne!(tables(IPV6_BASE, Family::V4), tables(IPV6_BASE, Family::V6));
    }
}
