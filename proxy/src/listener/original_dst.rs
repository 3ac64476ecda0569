//! `SO_ORIGINAL_DST`: the address a connection was sent to before iptables REDIRECT.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::AsRawFd;

const SO_ORIGINAL_DST: libc::c_int = 80;
const IP6T_SO_ORIGINAL_DST: libc::c_int = 80;

/// The original destination of a redirected connection, or `None` when it was not redirected
/// (or the kernel has no conntrack entry).
pub fn original_dst(socket: &impl AsRawFd, local: SocketAddr) -> Option<SocketAddr> {
    let fd = socket.as_raw_fd();
    // SAFETY: getsockopt writes at most `len` bytes into the zeroed storage we own.
    unsafe {
        let mut storage: libc::sockaddr_storage = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        let (level, opt) = if local.is_ipv4() {
            (libc::SOL_IP, SO_ORIGINAL_DST)
        } else {
            (libc::SOL_IPV6, IP6T_SO_ORIGINAL_DST)
        };
        let rc = libc::getsockopt(
            fd,
            level,
            opt,
            (&mut storage as *mut libc::sockaddr_storage).cast(),
            &mut len,
        );
        if rc != 0 {
            return None;
        }
        match storage.ss_family as libc::c_int {
            libc::AF_INET => {
                let sin = &*(&storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>();
                let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                Some(SocketAddr::V4(SocketAddrV4::new(
                    ip,
                    u16::from_be(sin.sin_port),
                )))
            }
            libc::AF_INET6 => {
                let sin6 =
                    &*(&storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>();
                let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                Some(SocketAddr::V6(SocketAddrV6::new(
                    ip,
                    u16::from_be(sin6.sin6_port),
                    0,
                    0,
                )))
            }
            _ => None,
        }
    }
}
