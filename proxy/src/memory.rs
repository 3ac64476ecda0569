//! Giving start-up memory back to the OS. Decoding the bootstrap touches megabytes that the
//! data path never reads again: heap freed after decoding, the embedded descriptor set, and
//! the code of the JSON/YAML decoders. Once serving, those pages are released; anything still
//! used is faulted back in from the executable on first touch.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

/// Releases freed heap and the executable's clean code and descriptor pages: after start-up,
/// and after an admin request that needed a descriptor pool (`/config_dump`, `/server_info`).
pub fn release_idle_pages() {
    // SAFETY: both only return free heap pages to the OS: mimalloc's (all Rust allocations)
    // and glibc's (what libc itself allocated, e.g. for name resolution).
    unsafe {
        mi_collect(true);
        libc::malloc_trim(0);
    }
    drop_pages(proto::embedded_descriptors());
    drop_code_pages();
}

/// Drops the resident pages of the executable's code; the data path faults back what it runs
/// (grouped at the start of `.text` by `link/hot-code.order`, see `build.rs`).
fn drop_code_pages() {
    for &(start, len) in code_mappings() {
        // SAFETY: the range is a read-only, file-backed mapping of our own executable with no
        // private (written) page; dropping its pages only makes the next access re-read them.
        unsafe {
            libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED);
        }
    }
}

/// What `/memory` and the `server.memory_*` gauges report, as near Envoy's tcmalloc figures as
/// mimalloc and procfs allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// mimalloc's committed bytes: an upper bound of what is allocated (tcmalloc's
    /// `allocated` counts only live blocks; mimalloc keeps no such total without its
    /// statistics build).
    pub committed: u64,
    /// The process's resident set (procfs `statm`); tcmalloc's figure counts only its heap.
    pub resident: u64,
}

/// The process's memory use now.
pub fn usage() -> Usage {
    let mut committed = 0usize;
    // SAFETY: mimalloc writes the one non-null out-pointer; the others are null, which
    // mi_process_info allows.
    unsafe {
        let null = std::ptr::null_mut();
        mi_process_info(null, null, null, null, null, &mut committed, null, null);
    }
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    Usage {
        committed: committed as u64,
        resident: pages * page,
    }
}

/// Sets `server.memory_allocated`, `server.memory_heap_size` and
/// `server.memory_physical_size` (Envoy sets them at each stats flush).
pub fn publish_gauges(stats: &crate::stats::Store) {
    let u = usage();
    stats.gauge("server.memory_allocated").set(u.committed);
    stats.gauge("server.memory_heap_size").set(u.committed);
    stats.gauge("server.memory_physical_size").set(u.resident);
}

/// `/memory`: Envoy's fields, their values as strings as Envoy writes them. `allocated` and
/// `heap_size` are mimalloc's committed bytes, `total_physical_bytes` the resident set;
/// mimalloc has no page-heap or thread-cache totals, so those are 0.
pub fn admin_json() -> serde_json::Value {
    let u = usage();
    serde_json::json!({
        "allocated": u.committed.to_string(),
        "heap_size": u.committed.to_string(),
        "pageheap_unmapped": "0",
        "pageheap_free": "0",
        "total_thread_cache": "0",
        "total_physical_bytes": u.resident.to_string(),
    })
}

/// The global allocator: mimalloc. Per request the proxy allocates and frees dozens of small
/// objects across hyper, h2 and its own code; glibc's per-thread cache holds only 7 blocks per
/// size and sends the rest through its slower shared bins.
#[global_allocator]
static ALLOCATOR: Allocator = Allocator;

/// The alignment every mimalloc block of at least this size has (`MI_MAX_ALIGN_SIZE`); smaller
/// blocks are word-aligned, which is all a layout smaller than this can ask for.
const MALLOC_ALIGN: usize = 16;

/// mimalloc, entered through plain `mi_malloc` whenever its blocks are aligned enough anyway.
/// The `mimalloc` crate always calls `mi_malloc_aligned`, which in mimalloc 3 sends every
/// block over 1 KiB whose size is not a power of two through its slow over-allocating path
/// (≈ 240 instructions, two or three times per proxied request), alignment 1 included.
struct Allocator;

impl Allocator {
    /// Whether `mi_malloc` of `size` bytes is aligned to `align` (the rule `std` applies to
    /// `malloc`).
    fn plain(size: usize, align: usize) -> bool {
        align <= MALLOC_ALIGN && align <= size
    }
}

// SAFETY: every block comes from mimalloc and goes back to it: `mi_free` and `mi_realloc`
// take blocks of either entry point, and `plain` only lets through layouts whose alignment
// `mi_malloc` guarantees.
unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if Self::plain(layout.size(), layout.align()) {
            // SAFETY: mimalloc's malloc, valid for any size.
            unsafe { mi_malloc(layout.size()).cast() }
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { mimalloc::MiMalloc.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if Self::plain(layout.size(), layout.align()) {
            // SAFETY: mimalloc's calloc-like zeroing malloc, valid for any size.
            unsafe { mi_zalloc(layout.size()).cast() }
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, hence from mimalloc.
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if Self::plain(new_size, layout.align()) {
            // SAFETY: `ptr` is a live mimalloc block; the new block has `plain` alignment.
            unsafe { mi_realloc(ptr.cast(), new_size).cast() }
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
        }
    }
}

/// Runs [`configure_allocator`] as an ELF constructor: before the Rust runtime allocates
/// anything, so mimalloc's first arena is created with these options.
#[used]
#[unsafe(link_section = ".init_array")]
static CONFIGURE_ALLOCATOR: extern "C" fn() = {
    extern "C" fn configure() {
        configure_allocator();
    }
    configure
};

/// `mi_option_arena_eager_commit` in mimalloc 3's `mi_option_e` (libmimalloc-sys pins the C
/// sources; a mimalloc upgrade must re-check these indices). Eagerly committed arenas keep freed
/// pages resident.
const ARENA_EAGER_COMMIT: i32 = 4;
/// `mi_option_purge_delay`: milliseconds before a free page goes back to the OS.
const PURGE_DELAY: i32 = 15;

/// mimalloc's purge delay before start-up set it to 0, restored once serving.
static SERVING_PURGE_DELAY: AtomicI64 = AtomicI64::new(0);

/// Tunes mimalloc for a small resident set: freed memory goes back to the OS instead of
/// staying committed in its arenas, and during start-up at once, so the transient memory of
/// decoding a large bootstrap (YAML events, JSON tree, protobuf messages, one after the other)
/// does not add up in the peak. Must run before the first allocation.
fn configure_allocator() {
    // SAFETY: plain option getters and setters of the linked allocator, valid at any time.
    unsafe {
        mi_option_set(ARENA_EAGER_COMMIT, 0);
        SERVING_PURGE_DELAY.store(mi_option_get(PURGE_DELAY), Ordering::Relaxed);
        mi_option_set(PURGE_DELAY, 0);
    }
}

/// The pending [`release_free_heap_soon`].
static HEAP_RELEASE: AfterQuiet = AfterQuiet::new();
/// The pending [`release_code_pages_soon`].
static CODE_RELEASE: AfterQuiet = AfterQuiet::new();

/// How long a release waits with no new request for it.
const QUIET: std::time::Duration = std::time::Duration::from_secs(1);

/// Gives the heap this thread freed back to the OS once a second has passed without another
/// call. Meant for a current-thread tokio runtime (the xDS thread's), whose tasks run on the
/// calling thread; does nothing outside a runtime. mimalloc purges freed pages only when the
/// thread that freed them allocates or frees again, and the xDS thread sleeps between
/// updates: after a 10,000-cluster push it kept about 40 MB of freed pages (the decoded
/// responses) resident for good.
pub fn release_free_heap_soon() {
    HEAP_RELEASE.request(|| {
        // SAFETY: only returns this thread's free heap pages to the OS.
        unsafe { mi_collect(true) }
    });
}

/// Drops the executable's code pages once a second has passed without another call, so the
/// code that decoded and compiled an xDS update (megabytes, scattered over the executable)
/// does not stay in the resident set after it ran; the data path faults back its own,
/// grouped, code. While updates keep coming (an EDS churn) the pages stay: dropping them every
/// second had each next update fault them back. Does nothing outside a tokio runtime.
pub fn release_code_pages_soon() {
    CODE_RELEASE.request(drop_code_pages);
}

/// A release run on the current runtime once [`QUIET`] has passed since the last request.
struct AfterQuiet {
    /// Whether a task waits to run it.
    pending: AtomicBool,
    /// When it is due: each request pushes it back.
    due: std::sync::Mutex<Option<tokio::time::Instant>>,
}

impl AfterQuiet {
    const fn new() -> AfterQuiet {
        AfterQuiet {
            pending: AtomicBool::new(false),
            due: std::sync::Mutex::new(None),
        }
    }

    /// Sets when the release is due, if `due` is given; answers when it was due before.
    fn set_due(&self, due: Option<tokio::time::Instant>) -> Option<tokio::time::Instant> {
        let mut slot = self
            .due
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let before = *slot;
        if due.is_some() {
            *slot = due;
        }
        before
    }

    /// Asks for `release` a quiet second from now, on the current runtime.
    fn request(&'static self, release: fn()) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        self.set_due(Some(tokio::time::Instant::now() + QUIET));
        if self.pending.swap(true, Ordering::AcqRel) {
            return;
        }
        runtime.spawn(async move {
            while let Some(due) = self.set_due(None)
                && due > tokio::time::Instant::now()
            {
                tokio::time::sleep_until(due).await;
            }
            self.pending.store(false, Ordering::Release);
            release();
        });
    }
}

/// Start-up is over: freed pages now stay for mimalloc's default delay (1 s in mimalloc 3),
/// so the data path reuses them instead of faulting them in again (a 10 ms delay cost HTTP/2
/// ~3 % more CPU in `madvise` and page faults); then what start-up left is released.
pub fn now_serving() {
    let delay = SERVING_PURGE_DELAY.load(Ordering::Relaxed);
    // SAFETY: a plain option setter of the linked allocator, valid at any time.
    unsafe {
        mi_option_set(PURGE_DELAY, delay);
    }
    release_idle_pages();
}

unsafe extern "C" {
    /// mimalloc's `malloc` (linked in by the `mimalloc` crate).
    fn mi_malloc(size: usize) -> *mut libc::c_void;
    /// mimalloc's `malloc` returning zeroed memory.
    fn mi_zalloc(size: usize) -> *mut libc::c_void;
    /// mimalloc's `realloc`.
    fn mi_realloc(ptr: *mut libc::c_void, size: usize) -> *mut libc::c_void;
    /// mimalloc's "free what you can now".
    fn mi_collect(force: bool);
    /// mimalloc's process statistics (any pointer may be null).
    fn mi_process_info(
        elapsed_msecs: *mut usize,
        user_msecs: *mut usize,
        system_msecs: *mut usize,
        current_rss: *mut usize,
        peak_rss: *mut usize,
        current_commit: *mut usize,
        peak_commit: *mut usize,
        page_faults: *mut usize,
    );
    /// Sets one of mimalloc's `mi_option_e` options.
    fn mi_option_set(option: i32, value: libc::c_long);
    /// Reads one of mimalloc's `mi_option_e` options.
    fn mi_option_get(option: i32) -> libc::c_long;
}

/// Drops the whole pages inside a static byte slice of the executable's read-only data (the
/// embedded descriptor set, once a pool is built from it): never heap or writable memory.
pub(crate) fn drop_pages(bytes: &'static [u8]) {
    let page = 4096usize;
    let start = (bytes.as_ptr() as usize).div_ceil(page) * page;
    let end = (bytes.as_ptr() as usize + bytes.len()) / page * page;
    if end > start {
        // SAFETY: [start, end) lies inside a `'static` read-only slice of the executable's
        // read-only data, which is never written, so dropping the pages loses nothing.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
        }
    }
}

/// [`executable_code_mappings`], read once: the executable's mappings never change after
/// start-up, while reading `/proc/self/smaps` costs in proportion to the whole resident set
/// (at 10,000 clusters it was a fifth of the CPU of an EDS churn, done after every update).
fn code_mappings() -> &'static [(usize, usize)] {
    static CODE: std::sync::OnceLock<Vec<(usize, usize)>> = std::sync::OnceLock::new();
    CODE.get_or_init(executable_code_mappings)
}

/// `(start, len)` of every read-only mapping of the running executable (code and read-only
/// data) that holds no private page: nothing in it was ever written (relocated data made
/// read-only afterwards has private pages and is skipped), so every page can be re-read from
/// the file.
fn executable_code_mappings() -> Vec<(usize, usize)> {
    let Ok(exe) = std::fs::read_link("/proc/self/exe") else {
        return Vec::new();
    };
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    let mut current: Option<(usize, usize)> = None;
    for line in smaps.lines() {
        if let Some(kb) = line.strip_prefix("Anonymous:") {
            if let Some(range) = current.take()
                && kb.trim() == "0 kB"
            {
                found.push(range);
            }
            continue;
        }
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else {
            continue;
        };
        let path = fields.nth(3);
        current = (matches!(perms, "r-xp" | "r--p")
            && path.is_some_and(|p| std::path::Path::new(p) == exe))
        .then_some((a, b - a));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    static QUIET_TEST: AfterQuiet = AfterQuiet::new();
    static RELEASED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    fn count_release() {
        RELEASED.fetch_add(1, Ordering::Relaxed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_waits_for_a_quiet_second_and_runs_once() {
        use tokio::time::{Duration, advance};
        let released = || RELEASED.load(Ordering::Relaxed);
        // Settles the spawned task at the paused clock's current time.
        async fn settle() {
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        }
        QUIET_TEST.request(count_release);
        advance(Duration::from_millis(800)).await;
        settle().await;
        QUIET_TEST.request(count_release);
        advance(Duration::from_millis(400)).await;
        settle().await;
        assert_eq!(
            released(),
            0,
            "a second after the first request, not after the last"
        );
        advance(Duration::from_millis(700)).await;
        settle().await;
        assert_eq!(released(), 1, "a quiet second after the last request");
        advance(Duration::from_secs(5)).await;
        settle().await;
        assert_eq!(released(), 1, "once for both requests");
        QUIET_TEST.request(count_release);
        advance(Duration::from_millis(1100)).await;
        settle().await;
        assert_eq!(released(), 2, "a later request releases again");
    }

    #[test]
    fn blocks_have_the_layouts_alignment_through_realloc() {
        let sizes = [
            1, 3, 8, 12, 16, 24, 40, 100, 624, 1024, 1248, 3000, 8192, 70_000,
        ];
        for align in [1, 2, 4, 8, 16, 32, 128] {
            for &size in &sizes {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: every size is non-zero; each block is written only within its size
                // and resized or freed with the layout it has.
                unsafe {
                    let mut block = Allocator.alloc(layout);
                    assert_eq!(block as usize % align, 0, "alloc {size} align {align}");
                    block.write_bytes(0xab, size);
                    for &other in &sizes {
                        let moved = Allocator.realloc(block, layout, other);
                        assert_eq!(moved as usize % align, 0, "{size} → {other} align {align}");
                        let kept = size.min(other);
                        assert!((0..kept).all(|i| *moved.add(i) == 0xab), "{size} → {other}");
                        let resized = Layout::from_size_align(other, align).unwrap();
                        block = Allocator.realloc(moved, resized, size);
                        assert_eq!(block as usize % align, 0, "{other} → {size} align {align}");
                        block.add(kept).write_bytes(0xab, size - kept);
                    }
                    Allocator.dealloc(block, layout);
                    let zeroed = Allocator.alloc_zeroed(layout);
                    assert_eq!(
                        zeroed as usize % align,
                        0,
                        "alloc_zeroed {size} align {align}"
                    );
                    assert!((0..size).all(|i| *zeroed.add(i) == 0));
                    Allocator.dealloc(zeroed, layout);
                }
            }
        }
    }

    #[test]
    fn finds_this_executables_code() {
        let code = executable_code_mappings();
        assert!(!code.is_empty());
        let here = finds_this_executables_code as fn() as usize;
        assert!(code.iter().any(|(s, l)| (*s..s + l).contains(&here)));
        let before = proto::embedded_descriptors().to_vec();
        release_idle_pages();
        // Dropped pages come back from the executable unchanged.
        assert!(proto::embedded_descriptors() == before.as_slice());
    }
}
