//! [`Mark`]: what names an admission that may be given back. Its own module because both the
//! peer frames and the region frames carry it.

use serde::{Deserialize, Serialize};

/// Names an admission that may be given back: when it was decided and what its decision
/// said of the bucket (its `reset`), both ns on the deciding node's clock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Mark {
    pub reset_ns: u64,
    pub at_ns: u64,
}
