//! revoy: a data-plane proxy that runs Envoy's configuration.
