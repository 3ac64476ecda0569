//! Zero-copy forwarding between two TCP sockets with `splice(2)` through a pipe (Linux).
//!
//! Bytes move socket -> pipe -> socket inside the kernel; the pipe holds references to the
//! received pages, so nothing is copied through user space. Both sockets stay nonblocking and
//! are driven by tokio's readiness (`readable()`/`writable()` + `try_io`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use tokio::io::Interest;
use tokio::net::TcpStream;

use super::{Activity, Tally};

/// How a splice forwarding ended.
pub(super) enum Forwarded {
    /// The reading side reached end of stream; everything read was written.
    Eof,
    /// splice(2) is not usable for these sockets and nothing was moved: copy instead.
    Unsupported,
}

/// A nonblocking pipe owned by one direction of a connection.
pub(super) struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    /// Creates a nonblocking, close-on-exec pipe.
    pub(super) fn new() -> io::Result<Pipe> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok(Pipe { read, write })
    }

    /// The pipe's capacity in bytes.
    fn size(&self) -> usize {
        // SAFETY: F_GETPIPE_SZ only reads the size of an open pipe descriptor.
        let size = unsafe { libc::fcntl(self.write.as_raw_fd(), libc::F_GETPIPE_SZ) };
        usize::try_from(size)
            .ok()
            .filter(|s| *s > 0)
            .unwrap_or(64 * 1024)
    }

    /// Grows the pipe to [`BULK_PIPE_SIZE`] if the system allows it; returns the capacity.
    fn grow(&self) -> usize {
        // SAFETY: F_SETPIPE_SZ only resizes an open pipe; on failure (e.g. the per-user pipe
        // limit) the pipe keeps its size.
        unsafe {
            libc::fcntl(
                self.write.as_raw_fd(),
                libc::F_SETPIPE_SZ,
                BULK_PIPE_SIZE as libc::c_int,
            );
        }
        self.size()
    }

    /// Forwards `from` to `to` until `from` reaches end of stream and everything read was
    /// written (the caller then shuts down `to`'s write side). Reading and writing overlap:
    /// the pipe keeps filling from `from` while `to` drains it.
    pub(super) async fn forward(
        &self,
        from: &TcpStream,
        to: &TcpStream,
        activity: &Activity<'_>,
        bytes: &Tally<'_>,
    ) -> io::Result<Forwarded> {
        let mut capacity = self.size();
        let mut grown = false;
        let mut buffered = 0usize;
        let mut eof = false;
        let mut moved_any = false;
        loop {
            let mut progress = false;
            if !eof && buffered < capacity {
                let r = from.try_io(Interest::READABLE, || {
                    splice(
                        from.as_raw_fd(),
                        self.write.as_raw_fd(),
                        capacity - buffered,
                    )
                });
                match r {
                    Ok(0) => eof = true,
                    Ok(n) => {
                        buffered += n;
                        if buffered == capacity && !grown {
                            // A full pipe means a bulk transfer: fewer, larger splices.
                            grown = true;
                            capacity = self.grow();
                        }
                        moved_any = true;
                        progress = true;
                        activity.touch();
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) if !moved_any && unsupported(&e) => return Ok(Forwarded::Unsupported),
                    Err(e) => return Err(e),
                }
            }
            if buffered > 0 {
                let r = to.try_io(Interest::WRITABLE, || {
                    splice(self.read.as_raw_fd(), to.as_raw_fd(), buffered)
                });
                match r {
                    Ok(m) => {
                        // Counted once written, like the copy path.
                        buffered -= m;
                        progress = true;
                        bytes.add(m as u64);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
            if eof && buffered == 0 {
                return Ok(Forwarded::Eof);
            }
            if progress {
                continue;
            }
            let can_read = !eof && buffered < capacity;
            tokio::select! {
                r = from.readable(), if can_read => r?,
                r = to.writable(), if buffered > 0 => r?,
            }
        }
    }
}

/// The pipe size of a connection that filled its default pipe: 1 MiB (Linux's default
/// `pipe-max-size`), sixteen times the default, so a fast sender is not throttled to 64 KiB
/// per wake-up. Interactive connections keep the default and its smaller share of the
/// per-user pipe budget.
const BULK_PIPE_SIZE: usize = 1024 * 1024;

/// Errors meaning "splice cannot serve these descriptors", not "the connection failed". EPERM
/// is not one splice(2) itself returns: it comes from a seccomp profile or security module that
/// denies the call (Docker's and Kubernetes' default profiles answer a denied call with EPERM,
/// runc and crun one they do not know with ENOSYS).
fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP | libc::EPERM)
    )
}

/// One nonblocking splice(2) of at most `len` bytes from `from` to `to`.
fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    // SAFETY: both descriptors are open for the duration of the call (borrowed from live
    // owners); null offsets are required for sockets and pipes.
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::stats::Store;

    /// A connected loopback pair: (client side, accepted side).
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        (client, accepted)
    }

    #[tokio::test]
    async fn forwards_more_than_a_pipe_and_stops_at_eof() {
        let (mut source, from) = pair().await;
        let (mut to, mut sink) = pair().await;
        let data: Vec<u8> = (0..4 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
        let expected = data.clone();
        let writer = tokio::spawn(async move {
            source.write_all(&data).await.unwrap();
            source.shutdown().await.unwrap();
            source
        });
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            sink.read_to_end(&mut got).await.unwrap();
            got
        });
        let pipe = Pipe::new().unwrap();
        let bytes = Store::new().counter("bytes");
        let ended = pipe
            .forward(&from, &to, &Activity::new(None), &Tally::new(&bytes, None))
            .await
            .unwrap();
        assert!(matches!(ended, Forwarded::Eof));
        to.shutdown().await.unwrap();
        let got = reader.await.unwrap();
        writer.await.unwrap();
        assert_eq!(got.len(), expected.len());
        assert!(got == expected, "forwarded bytes differ");
        assert_eq!(bytes.value(), expected.len() as u64);
    }
}
