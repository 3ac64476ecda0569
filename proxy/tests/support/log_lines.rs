//! Reading an access-log file a proxy under test is writing.

use std::path::Path;
use std::time::{Duration, Instant};

/// The lines of the file at `path` once it has `want` of them (or after 10 s, as many as it
/// has).
pub fn read_lines(path: &Path, want: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_owned).collect();
        if lines.len() >= want || Instant::now() > deadline {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
