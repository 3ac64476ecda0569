//! What SotW and Delta share once a response is decoded: the duplicate check, the handler
//! call, the verdict and its `error_detail`, and the push-log entry.

use std::collections::BTreeSet;
use std::time::{Instant, SystemTime};

use proto::pb::google::rpc::Status as RpcStatus;

use super::protocol::Progress;
use crate::{Applied, Handler, Names, Push, Rejected, Resource, Update, Verdict};

/// gRPC's INVALID_ARGUMENT, the code of a NACK's `error_detail`.
const INVALID_ARGUMENT: i32 = 3;

/// A decoded response of one type.
pub(super) struct Incoming {
    pub(super) type_url: String,
    pub(super) version_info: String,
    pub(super) nonce: String,
    /// Resources for the handler.
    pub(super) resources: Vec<Resource>,
    /// Resources refused before the handler (wrong type URL, unreadable name).
    pub(super) refused: Vec<Rejected>,
    /// Names removed.
    pub(super) removed: Vec<String>,
    /// When it arrived.
    pub(super) at: SystemTime,
}

/// How a response was answered.
pub(super) struct Outcome {
    /// Whether the handler was called (not when the response was refused as a whole).
    pub(super) delivered: bool,
    /// The resources the handler applied: their names and versions.
    pub(super) applied: Vec<(String, String)>,
    pub(super) verdict: Verdict,
    pub(super) push: Push,
}

impl Outcome {
    /// The `error_detail` of the answer: none for an ACK.
    pub(super) fn error_detail(&self) -> Option<RpcStatus> {
        match &self.verdict {
            Verdict::Ack => None,
            Verdict::Nack(message) => Some(RpcStatus {
                code: INVALID_ARGUMENT,
                message: message.clone(),
                details: Vec::new(),
            }),
        }
    }
}

/// The first name that appears twice among the resources and the refused ones.
fn duplicate(incoming: &Incoming) -> Option<&str> {
    let mut seen = BTreeSet::new();
    let names = incoming.resources.iter().map(|r| r.name.as_str());
    let refused = incoming.refused.iter().map(|r| r.name.as_str());
    names.chain(refused).find(|name| !seen.insert(*name))
}

/// Checks a response, hands it to the handler, and decides the verdict; `progress` takes the
/// response's nonce, and its version if ACKed.
pub(super) fn deliver(
    incoming: Incoming,
    handler: &dyn Handler,
    progress: &mut Progress,
) -> Outcome {
    progress.nonce.clone_from(&incoming.nonce);
    let names: Vec<&String> = incoming
        .resources
        .iter()
        .map(|r| &r.name)
        .chain(incoming.refused.iter().map(|r| &r.name))
        .collect();
    let push = |verdict: Verdict, answer: &Applied, removed: &[String], apply_time| {
        let rejected: Vec<&Rejected> = incoming.refused.iter().chain(&answer.rejected).collect();
        Push {
            at: incoming.at,
            type_url: incoming.type_url.clone(),
            version: incoming.version_info.clone(),
            nonce: incoming.nonce.clone(),
            resources: Names::of(names.iter().copied()),
            added: Names::of(&answer.added),
            changed: Names::of(&answer.changed),
            unchanged: names
                .len()
                .saturating_sub(rejected.len() + answer.added.len() + answer.changed.len()),
            removed: Names::of(removed),
            rejected: rejected
                .iter()
                .take(crate::PUSH_NAMES)
                .map(|r| (*r).clone())
                .collect(),
            rejected_count: rejected.len(),
            verdict,
            apply_time,
        }
    };
    if let Some(name) = duplicate(&incoming) {
        let reason = format!("duplicate resource name: {name}");
        handler.refused(
            &Update {
                type_url: incoming.type_url.clone(),
                version_info: incoming.version_info.clone(),
                resources: incoming.resources.clone(),
                removed: Vec::new(),
            },
            &reason,
        );
        let verdict = Verdict::Nack(reason.clone());
        // Refused whole: nothing applied, nothing removed.
        let answer = Applied::rejecting(vec![Rejected {
            name: name.to_owned(),
            reason,
        }]);
        let mut push = push(verdict.clone(), &answer, &[], Default::default());
        push.unchanged = 0;
        return Outcome {
            delivered: false,
            applied: Vec::new(),
            push,
            verdict,
        };
    }
    let versions: Vec<(String, String)> = incoming
        .resources
        .iter()
        .map(|r| (r.name.clone(), r.version.clone()))
        .collect();
    let started = Instant::now();
    let answer = handler.apply(Update {
        type_url: incoming.type_url.clone(),
        version_info: incoming.version_info.clone(),
        resources: incoming.resources.clone(),
        removed: incoming.removed.clone(),
    });
    let apply_time = started.elapsed();
    let rejected_names: BTreeSet<&str> = answer.rejected.iter().map(|r| r.name.as_str()).collect();
    let applied = versions
        .into_iter()
        .filter(|(name, _)| !rejected_names.contains(name.as_str()))
        .collect();
    let lines: Vec<String> = incoming
        .refused
        .iter()
        .chain(&answer.rejected)
        .map(|r| format!("{}: {}", r.name, r.reason))
        .collect();
    let verdict = if lines.is_empty() {
        progress.acked_version.clone_from(&incoming.version_info);
        Verdict::Ack
    } else {
        Verdict::Nack(lines.join("\n"))
    };
    Outcome {
        delivered: true,
        applied,
        push: push(verdict.clone(), &answer, &incoming.removed, apply_time),
        verdict,
    }
}

#[cfg(test)]
mod tests {
    use super::super::AcceptAll;
    use super::*;

    fn resource(name: &str) -> Resource {
        Resource {
            name: name.into(),
            version: "1".into(),
            value: bytes::Bytes::new(),
        }
    }

    fn incoming(
        resources: Vec<Resource>,
        refused: Vec<Rejected>,
        removed: Vec<String>,
    ) -> Incoming {
        Incoming {
            type_url: crate::CLUSTER_TYPE_URL.into(),
            version_info: "1".into(),
            nonce: "n".into(),
            resources,
            refused,
            removed,
            at: SystemTime::now(),
        }
    }

    #[test]
    fn a_large_push_is_logged_with_its_counts_and_the_first_names() {
        let resources = (0..250).map(|i| resource(&format!("c{i:04}"))).collect();
        let removed = (0..120).map(|i| format!("gone{i}")).collect();
        let outcome = deliver(
            incoming(resources, Vec::new(), removed),
            &AcceptAll,
            &mut Progress::default(),
        );
        assert_eq!(outcome.verdict, Verdict::Ack);
        let push = outcome.push;
        assert_eq!((push.resources.count, push.removed.count), (250, 120));
        assert_eq!(push.resources.first.len(), crate::PUSH_NAMES);
        assert_eq!(push.resources.first[0], "c0000");
        assert_eq!(push.removed.first.len(), crate::PUSH_NAMES);
        assert_eq!(
            push.unchanged, 250,
            "the handler named nothing added or changed"
        );
    }

    /// Adds `a`, changes `b`, rejects `bad`, leaves `same` as it was.
    struct Classifying;

    impl Handler for Classifying {
        fn apply(&self, _update: Update) -> Applied {
            Applied {
                rejected: vec![Rejected {
                    name: "bad".into(),
                    reason: "field: wrong".into(),
                }],
                added: vec!["a".into()],
                changed: vec!["b".into()],
            }
        }
    }

    #[test]
    fn the_log_tells_added_changed_unchanged_removed_and_rejected() {
        let refused = vec![Rejected {
            name: "unreadable".into(),
            reason: "cannot decode".into(),
        }];
        let outcome = deliver(
            incoming(
                ["a", "b", "same", "bad"].map(resource).into(),
                refused,
                vec!["gone".into()],
            ),
            &Classifying,
            &mut Progress::default(),
        );
        let push = outcome.push;
        assert_eq!(push.added.first, ["a"]);
        assert_eq!(push.changed.first, ["b"]);
        assert_eq!(push.unchanged, 1);
        assert_eq!(push.removed.first, ["gone"]);
        let rejected: Vec<_> = push
            .rejected
            .iter()
            .map(|r| (&*r.name, &*r.reason))
            .collect();
        assert_eq!(
            rejected,
            [("unreadable", "cannot decode"), ("bad", "field: wrong")]
        );
        assert_eq!(push.rejected_count, 2);
        assert!(matches!(push.verdict, Verdict::Nack(_)));
    }

    /// Must not be applied; keeps what it is told was refused whole.
    #[derive(Default)]
    struct Refusals(std::sync::Mutex<Vec<String>>);

    impl Handler for Refusals {
        fn apply(&self, _update: Update) -> Applied {
            panic!("a refused update was applied")
        }

        fn refused(&self, update: &Update, reason: &str) {
            let told = format!("{} resources: {reason}", update.resources.len());
            self.0.lock().expect("refusals").push(told);
        }
    }

    #[test]
    fn a_response_refused_whole_applies_and_removes_nothing() {
        let handler = Refusals::default();
        let outcome = deliver(
            incoming(
                ["a", "a"].map(resource).into(),
                Vec::new(),
                vec!["gone".into()],
            ),
            &handler,
            &mut Progress::default(),
        );
        assert_eq!(
            *handler.0.lock().expect("refusals"),
            ["2 resources: duplicate resource name: a"]
        );
        assert!(!outcome.delivered);
        let push = outcome.push;
        assert_eq!(
            (push.added.count, push.changed.count, push.unchanged),
            (0, 0, 0)
        );
        assert_eq!(push.removed.count, 0);
        assert_eq!(push.rejected[0].name, "a");
        assert_eq!(push.rejected[0].reason, "duplicate resource name: a");
    }
}
