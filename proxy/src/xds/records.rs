//! What arrived over xDS, per resource: the version in force and when it was applied, and the
//! last rejection (rejected version, reason, time) — what `/config_dump` and `/xds` show.

use std::collections::BTreeMap;
use std::time::SystemTime;

use bytes::Bytes;

/// A rejected version of a resource.
#[derive(Debug, Clone)]
pub struct ErrorState {
    /// The version that was rejected.
    pub version: String,
    /// Why, with the field path.
    pub reason: String,
    /// When.
    pub at: SystemTime,
    /// The rejected resource, as received.
    pub value: Bytes,
}

/// Where a resource stands, as Envoy's client status names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Applied and serving.
    Acked,
    /// Its latest version was rejected (an earlier one may still serve).
    Nacked,
    /// Accepted but waiting for what it refers to (endpoints, route configurations).
    Warming,
}

/// One resource's record.
#[derive(Debug, Clone)]
pub struct Record {
    /// The version in force (empty when no version was ever accepted).
    pub version: String,
    /// The accepted resource, encoded (`None` when none was accepted).
    pub value: Option<Bytes>,
    /// When the version in force was applied.
    pub last_updated: SystemTime,
    /// The last rejection since the version in force, if any.
    pub error: Option<ErrorState>,
    /// Its status.
    pub status: Status,
    /// While `value` warms as an update of a resource already serving: the version still
    /// serving, its resource and when it was applied (`/config_dump` shows both, as Envoy's
    /// active and warming listener states).
    pub serving: Option<(String, Bytes, SystemTime)>,
}

/// The records of one resource type, by name.
#[derive(Debug, Default)]
pub struct Records {
    by_name: BTreeMap<String, Record>,
}

impl Records {
    /// The record of `name`.
    pub fn get(&self, name: &str) -> Option<&Record> {
        self.by_name.get(name)
    }

    /// Whether `name`'s accepted version is exactly `value` (an unchanged resource).
    pub fn unchanged(&self, name: &str, value: &Bytes) -> bool {
        self.by_name
            .get(name)
            .and_then(|r| r.value.as_ref())
            .is_some_and(|v| v == value)
    }

    /// Records `value` at `version` as accepted, with `status`.
    pub fn accept(&mut self, name: &str, version: &str, value: Bytes, status: Status) {
        self.by_name.insert(
            name.to_owned(),
            Record {
                version: version.to_owned(),
                value: Some(value),
                last_updated: SystemTime::now(),
                error: None,
                status,
                serving: None,
            },
        );
    }

    /// Records `value` at `version` as accepted and warming; a version serving until then is
    /// kept as [`Record::serving`] until the new one is activated ([`Records::set_status`]).
    pub fn accept_warming(&mut self, name: &str, version: &str, value: Bytes) {
        let serving = self
            .by_name
            .get(name)
            .and_then(|r| match (&r.serving, &r.value) {
                (Some(serving), _) => Some(serving.clone()),
                (None, Some(v)) if r.status != Status::Warming => {
                    Some((r.version.clone(), v.clone(), r.last_updated))
                }
                _ => None,
            });
        self.accept(name, version, value, Status::Warming);
        if let Some(r) = self.by_name.get_mut(name) {
            r.serving = serving;
        }
    }

    /// Sets the status of `name`'s accepted version.
    pub fn set_status(&mut self, name: &str, status: Status) {
        if let Some(r) = self.by_name.get_mut(name) {
            r.status = status;
            if status != Status::Warming {
                r.serving = None;
            }
        }
    }

    /// Records that `version` of `name` was rejected; the accepted version, if any, stays.
    pub fn reject(&mut self, name: &str, version: &str, value: Bytes, reason: &str) {
        let error = ErrorState {
            version: version.to_owned(),
            reason: reason.to_owned(),
            at: SystemTime::now(),
            value,
        };
        let r = self
            .by_name
            .entry(name.to_owned())
            .or_insert_with(|| Record {
                version: String::new(),
                value: None,
                last_updated: SystemTime::now(),
                error: None,
                status: Status::Nacked,
                serving: None,
            });
        r.error = Some(error);
        r.status = Status::Nacked;
    }

    /// Forgets `name`; answers whether it had an accepted version.
    pub fn remove(&mut self, name: &str) -> bool {
        self.by_name.remove(name).is_some_and(|r| r.value.is_some())
    }

    /// Every record, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Record)> {
        self.by_name.iter()
    }

    /// Names with an accepted version.
    pub fn accepted_names(&self) -> impl Iterator<Item = &String> {
        self.by_name
            .iter()
            .filter(|(_, r)| r.value.is_some())
            .map(|(n, _)| n)
    }
}
