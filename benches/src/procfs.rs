//! Process sampling: CPU time (the kernel's per-process CPU clock, and `/proc`'s user/system
//! split) and resident memory.

use std::fs;

/// Clock ticks per second used by the `utime`/`stime` fields of `/proc/<pid>/stat`.
pub fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// User and system CPU time of all threads of `pid`, in seconds.
pub fn cpu_times(pid: u32) -> Option<(f64, f64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((
        utime as f64 / ticks_per_second(),
        stime as f64 / ticks_per_second(),
    ))
}

/// CPU time of all threads of `pid` (user + system, threads that exited included), in
/// seconds, from the kernel's CPU clock of that process (`clock_getcpuclockid`): nanoseconds,
/// where `/proc/<pid>/stat` counts 10 ms clock ticks.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let pid = libc::pid_t::try_from(pid).ok()?;
    let mut clock: libc::clockid_t = 0;
    // SAFETY: the out-pointer is a valid clockid_t.
    if unsafe { libc::clock_getcpuclockid(pid, &mut clock) } != 0 {
        return None;
    }
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: the out-pointer is a valid timespec.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return None;
    }
    Some(ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9)
}

/// A `Vm*` line of `/proc/<pid>/status` (for example `VmRSS`, `VmHWM`), in KiB.
pub fn status_kib(pid: u32, key: &str) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| {
        let value = line.strip_prefix(key)?.strip_prefix(':')?;
        value.split_whitespace().next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_process() {
        let pid = std::process::id();
        let (user, sys) = cpu_times(pid).unwrap();
        assert!(user >= 0.0 && sys >= 0.0);
        let burn = std::time::Instant::now();
        let before = cpu_seconds(pid).unwrap();
        while burn.elapsed() < std::time::Duration::from_millis(30) {
            std::hint::black_box(0u64);
        }
        let spent = cpu_seconds(pid).unwrap() - before;
        assert!(spent > 0.02 && spent < 1.0, "{spent}");
        assert_eq!(cpu_seconds(u32::MAX), None);
        assert!(status_kib(pid, "VmRSS").unwrap() > 0);
        assert!(status_kib(pid, "VmHWM").unwrap() >= status_kib(pid, "VmRSS").unwrap() / 2);
        assert_eq!(status_kib(pid, "NoSuchKey"), None);
    }
}
