//! The rate limit descriptors of a request, for the rate limit filters: the policies the
//! filter's source selects, over the request as routed.

use super::FilterRequest;
use crate::route::Action;
use crate::route::rate_limit::{
    Descriptor, DescriptorFacts, DescriptorSource, request_descriptors,
};

impl FilterRequest<'_> {
    /// The descriptors `source` makes for this request (none without a route).
    pub(super) fn rate_limit_descriptors(&self, source: &DescriptorSource<'_>) -> Vec<Descriptor> {
        let Some(route) = self.route else {
            return Vec::new();
        };
        let request = self.route_request();
        let destination = match &route.route.action {
            Action::Forward(f) => f.pick_cluster(&request).map(|p| p.name.into_owned()),
            _ => None,
        };
        let facts = DescriptorFacts {
            request: &request,
            local_cluster: &self.conn.shared.tracers.local.cluster,
            destination_cluster: destination.as_deref(),
            remote: Some(self.conn.down.peer.ip()),
        };
        request_descriptors(source, &route, &facts)
    }

    /// The format context of header rules the rate limit filters apply.
    pub(super) fn format_context(&self) -> crate::route::format::FormatContext<'_> {
        crate::route::format::FormatContext {
            downstream_remote: Some(self.conn.down.peer),
            downstream_direct_remote: Some(self.conn.down.peer),
            downstream_local: Some(self.conn.local),
            request_method: Some(self.method.as_str()),
            request_authority: Some(self.authority),
            request_path: Some(self.path),
            ..Default::default()
        }
    }
}
