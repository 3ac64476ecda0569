//! A bootstrap document (`revoy -c` / `--config-yaml`: YAML or JSON with `@type` Anys) loaded
//! and compiled: refused with a ConfigError, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = revoy::fuzzing::bootstrap(text);
    }
});
