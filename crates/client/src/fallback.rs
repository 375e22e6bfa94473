//! The local limiter a client answers from when the cluster cannot: the nodes' algorithms and
//! bounded store, over a share of each limit (core's [`Share`]).

use crate::builder::FallbackShare;
use ringlimit_core::clock::{Clock, SystemClock};
use ringlimit_core::coordinator::Share;
use ringlimit_core::store::Store;

pub(crate) struct Fallback {
    store: Store,
    clock: SystemClock,
    policy: FallbackShare,
}

impl Fallback {
    pub fn new(max_keys: u64, policy: FallbackShare) -> Self {
        Self {
            store: Store::new(max_keys),
            clock: SystemClock::new(),
            policy,
        }
    }

    /// This client's share of every limit, over its own store.
    pub fn share(&self) -> Share<'_> {
        Share::new(&self.store, self.policy)
    }

    /// Now, on the fallback's clock.
    pub fn now(&self) -> u64 {
        self.clock.now()
    }

    /// Buckets held.
    pub fn len(&self) -> usize {
        self.store.len()
    }
}
