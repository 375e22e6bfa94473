//! Unit and property tests of the algorithms (manual time, no sleeps).
