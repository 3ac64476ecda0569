//! What arrived over xDS, per resource: the version in force and when it was applied, and the
//! last rejection (rejected version, reason, time) — what `/config_dump` and `/xds` show.

use std::collections::BTreeMap;
use std::sync::Arc;
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
    /// The server said it does not exist (a Delta removal of a route configuration or an
    /// endpoint assignment still in use); its last accepted version, if any, still serves.
    DoesNotExist,
}

/// One resource's record. What few records have (a rejection, a version still serving
/// while another warms) is boxed: a record per cluster and per endpoint assignment adds up.
#[derive(Debug, Clone)]
pub struct Record {
    /// The version in force (empty when no version was ever accepted); shared with the other
    /// resources of the response that brought it.
    pub version: Arc<str>,
    /// The accepted resource, encoded (`None` when none was accepted).
    pub value: Option<Bytes>,
    /// When the version in force was applied.
    pub last_updated: SystemTime,
    /// Its status (the client status `/config_dump` shows: a rejection since makes it
    /// NACKED).
    pub status: Status,
    /// Whether `value` warms, not yet in use (a rejection since leaves it warming).
    pub warming: bool,
    /// The last rejection since the version in force, if any.
    pub error: Option<Box<ErrorState>>,
    /// While `value` warms as an update of a resource already serving: the version still
    /// serving (`/config_dump` shows both, as Envoy's active and warming listener states).
    pub serving: Option<Box<Serving>>,
}

impl Record {
    /// The version serving (`/config_dump`'s active state): while an update warms, the
    /// version it replaces; else the accepted version, if any.
    pub fn active(&self) -> Option<Serving> {
        // A version kept as serving serves until the one warming is put in use, whatever
        // was rejected since.
        if self.warming || self.serving.is_some() {
            return self.serving.as_deref().cloned();
        }
        self.value.as_ref().map(|value| Serving {
            version: self.version.clone(),
            value: value.clone(),
            at: self.last_updated,
        })
    }
}

/// The version of a resource that serves while a newer one warms.
#[derive(Debug, Clone)]
pub struct Serving {
    /// Its version.
    pub version: Arc<str>,
    /// The resource, encoded.
    pub value: Bytes,
    /// When it was applied.
    pub at: SystemTime,
}

/// What one update applied, for the push log: the names that were new and those that
/// replaced an accepted version.
#[derive(Debug, Default)]
pub struct Changes {
    added: Vec<String>,
    changed: Vec<String>,
}

impl Changes {
    /// Notes that a version of `name` is being accepted into `records` (before it is): added
    /// when they hold no accepted version of it, else changed.
    pub fn note(&mut self, records: &Records, name: &str) {
        let held = records.get(name).is_some_and(|r| r.value.is_some());
        if held {
            self.changed.push(name.to_owned());
        } else {
            self.added.push(name.to_owned());
        }
    }

    /// The handler's answer: these changes, and `rejected`.
    pub fn answer(self, rejected: Vec<xds_client::Rejected>) -> xds_client::Applied {
        xds_client::Applied {
            rejected,
            added: self.added,
            changed: self.changed,
        }
    }
}

/// The records of one resource type, by name.
#[derive(Debug, Default)]
pub struct Records {
    by_name: BTreeMap<String, Record>,
    /// The version last recorded, shared by the records that have it.
    last_version: Option<Arc<str>>,
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

    /// `version`, shared with the records that have it already when it is the last one seen
    /// (the resources of one response share their version).
    fn shared_version(&mut self, version: &str) -> Arc<str> {
        match &self.last_version {
            Some(v) if **v == *version => v.clone(),
            _ => {
                let v: Arc<str> = version.into();
                self.last_version = Some(v.clone());
                v
            }
        }
    }

    /// Records `value` at `version` as accepted, with `status`.
    pub fn accept(&mut self, name: &str, version: &str, value: Bytes, status: Status) {
        let version = self.shared_version(version);
        self.by_name.insert(
            name.to_owned(),
            Record {
                version,
                value: Some(value),
                last_updated: SystemTime::now(),
                error: None,
                status,
                warming: status == Status::Warming,
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
                (None, Some(v)) if !r.warming => Some(Box::new(Serving {
                    version: r.version.clone(),
                    value: v.clone(),
                    at: r.last_updated,
                })),
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
            r.warming = status == Status::Warming;
            if !r.warming {
                r.serving = None;
            }
        }
    }

    /// `name` was sent again unchanged: one the server had said does not exist is acknowledged
    /// again.
    pub fn resent(&mut self, name: &str) {
        if let Some(r) = self.by_name.get_mut(name)
            && r.status == Status::DoesNotExist
        {
            r.status = Status::Acked;
        }
    }

    /// Records that `version` of `name` was rejected; the accepted version, if any, stays.
    pub fn reject(&mut self, name: &str, version: &str, value: Bytes, reason: &str) {
        let error = Box::new(ErrorState {
            version: version.to_owned(),
            reason: reason.to_owned(),
            at: SystemTime::now(),
            value,
        });
        let r = self
            .by_name
            .entry(name.to_owned())
            .or_insert_with(|| Record {
                version: "".into(),
                value: None,
                last_updated: SystemTime::now(),
                error: None,
                status: Status::Nacked,
                warming: false,
                serving: None,
            });
        r.error = Some(error);
        r.status = Status::Nacked;
    }

    /// The accepted version of `name` could not be put in use: it is recorded as rejected
    /// with `reason`, and the version serving before it, if any, is in force again (sent
    /// again, the failed version is tried anew).
    pub fn failed(&mut self, name: &str, reason: &str) {
        let Some(r) = self.by_name.get_mut(name) else {
            return;
        };
        let Some(value) = r.value.take() else {
            return;
        };
        r.error = Some(Box::new(ErrorState {
            version: r.version.to_string(),
            reason: reason.to_owned(),
            at: SystemTime::now(),
            value,
        }));
        r.warming = false;
        match r.serving.take() {
            Some(serving) => {
                r.version = serving.version;
                r.value = Some(serving.value);
                r.last_updated = serving.at;
                r.status = Status::Acked;
            }
            None => {
                r.version = "".into();
                r.status = Status::Nacked;
            }
        }
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
