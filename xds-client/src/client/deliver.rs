//! What SotW and Delta share once a response is decoded: the duplicate check, the handler
//! call, the verdict and its `error_detail`, and the push-log entry.

use std::collections::BTreeSet;
use std::time::{Instant, SystemTime};

use proto::pb::google::rpc::Status as RpcStatus;

use super::protocol::Progress;
use crate::{Handler, Push, Rejected, Resource, Update, Verdict};

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
    let mut names: Vec<String> = incoming.resources.iter().map(|r| r.name.clone()).collect();
    names.extend(incoming.refused.iter().map(|r| r.name.clone()));
    let push = |verdict: Verdict, apply_time| Push {
        at: incoming.at,
        type_url: incoming.type_url.clone(),
        version: incoming.version_info.clone(),
        nonce: incoming.nonce.clone(),
        resources: names.iter().take(crate::PUSH_NAMES).cloned().collect(),
        resource_count: names.len(),
        removed: incoming
            .removed
            .iter()
            .take(crate::PUSH_NAMES)
            .cloned()
            .collect(),
        removed_count: incoming.removed.len(),
        verdict,
        apply_time,
    };
    if let Some(name) = duplicate(&incoming) {
        let verdict = Verdict::Nack(format!("duplicate resource name: {name}"));
        return Outcome {
            delivered: false,
            applied: Vec::new(),
            push: push(verdict.clone(), Default::default()),
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
        push: push(verdict.clone(), apply_time),
        verdict,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Applied;

    struct AcceptAll;

    impl Handler for AcceptAll {
        fn apply(&self, _update: Update) -> Applied {
            Applied::default()
        }
    }

    #[test]
    fn a_large_push_is_logged_with_its_counts_and_the_first_names() {
        let resource = |i: usize| Resource {
            name: format!("c{i:04}"),
            version: "1".into(),
            value: bytes::Bytes::new(),
        };
        let incoming = Incoming {
            type_url: crate::CLUSTER_TYPE_URL.into(),
            version_info: "1".into(),
            nonce: "n".into(),
            resources: (0..250).map(resource).collect(),
            refused: Vec::new(),
            removed: (0..120).map(|i| format!("gone{i}")).collect(),
            at: SystemTime::now(),
        };
        let outcome = deliver(incoming, &AcceptAll, &mut Progress::default());
        assert_eq!(outcome.verdict, Verdict::Ack);
        let push = outcome.push;
        assert_eq!((push.resource_count, push.removed_count), (250, 120));
        assert_eq!(push.resources.len(), crate::PUSH_NAMES);
        assert_eq!(push.resources[0], "c0000");
        assert_eq!(push.removed.len(), crate::PUSH_NAMES);
    }
}
