//! Envoy's text readouts: a stat whose value is a string (an xDS subscription's
//! `version_text`). Set on the control path only, so a lock per value is cheap enough.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A text readout's value and whether it was ever set.
#[derive(Debug, Default)]
struct Value {
    text: Mutex<String>,
    used: AtomicBool,
}

/// A named string stat (Envoy's `TextReadout`). Cheap to clone; clones share the value.
#[derive(Clone, Debug, Default)]
pub struct TextReadout(Arc<Value>);

impl TextReadout {
    /// Sets the value (and marks it used, as Envoy's `set` does).
    pub fn set(&self, text: &str) {
        let mut value = self.0.text.lock().expect("text readout lock");
        value.clear();
        value.push_str(text);
        self.0.used.store(true, Ordering::Relaxed);
    }

    /// The current value.
    pub fn value(&self) -> String {
        self.0.text.lock().expect("text readout lock").clone()
    }

    /// Whether it was ever set (Envoy's `usedonly`).
    pub fn used(&self) -> bool {
        self.0.used.load(Ordering::Relaxed)
    }

    /// Whether another handle than this one exists (the store asks of its own).
    pub(super) fn shared(&self) -> bool {
        Arc::strong_count(&self.0) > 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_the_value_and_setting_marks_it_used() {
        let a = TextReadout::default();
        let b = a.clone();
        assert!(!b.used());
        assert_eq!(b.value(), "");
        a.set("v1");
        a.set("v2 \"x\"");
        assert!(b.used());
        assert_eq!(b.value(), "v2 \"x\"");
    }
}
