//! Metrics read at scrape time, declared rather than encoded: a subsystem lists its families
//! once, as a `const` table of [`Family`] over what it counts (name, help, type, labels, how
//! to read each value), and the node registers the table with that source
//! ([`super::Metrics::scrape`]). The encoding is here alone.
//!
//! ```
//! use ringlimit_node::metrics::{Family, Metrics, load};
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU64, Ordering};
//!
//! /// What a cache counts, where it happens.
//! #[derive(Default)]
//! struct CacheStats {
//!     entries: AtomicU64,
//!     hits: AtomicU64,
//!     misses: AtomicU64,
//! }
//!
//! const METRICS: &[Family<CacheStats>] = &[
//!     Family::gauge("cache_entries", "Entries in the cache.", |c| load(&c.entries)),
//!     Family::counter_by(
//!         "cache_lookups",
//!         "Lookups by result.",
//!         "result",
//!         &[("hit", |c| load(&c.hits)), ("miss", |c| load(&c.misses))],
//!     ),
//! ];
//!
//! let stats = Arc::new(CacheStats::default());
//! let mut metrics = Metrics::new();
//! metrics.scrape(METRICS, stats.clone());
//! stats.hits.fetch_add(1, Ordering::Relaxed);
//! let text = metrics.encode().unwrap();
//! assert!(text.contains("# TYPE ringlimit_cache_entries gauge\nringlimit_cache_entries 0\n"));
//! assert!(text.contains("ringlimit_cache_lookups_total{result=\"hit\"} 1\n"));
//! ```
//!
//! Names go without the registry's `ringlimit_` prefix and a counter's `_total`; help texts are
//! exported as written (so they end with their full stop). The readers run at each scrape,
//! never on a check: what a check updates stays an atomic or sharded counter where it happens.

use super::sharded::ShardedHistogram;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use std::sync::Arc;

/// One family of series, read from a `T` at each scrape.
pub struct Family<T: 'static> {
    name: &'static str,
    help: &'static str,
    shape: Shape<T>,
}

/// Series told apart by one label: `(the label's value, how to read the series)` each.
pub type ByLabel<T> = &'static [(&'static str, fn(&T) -> u64)];

/// What a family's series are and how each is read.
enum Shape<T: 'static> {
    /// One series without labels.
    One(Kind, ReadOne<T>),
    /// A fixed set of series told apart by one label: `(label value, reader)` each.
    By(Kind, &'static str, ByLabel<T>),
    /// Series found at scrape time (by rule, by peer, ...), labelled by these names.
    Each(Kind, &'static [&'static str], fn(&T) -> Vec<Series>),
    /// A histogram the subsystem observes itself.
    Histogram(fn(&T) -> &ShardedHistogram),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
}

/// How the one series of a family without labels is read.
enum ReadOne<T: 'static> {
    Int(fn(&T) -> u64),
    Float(fn(&T) -> f64),
}

/// A value read at scrape time. A gauge of a `u64` past `i64::MAX` shows `i64::MAX`; a
/// counter of a negative `i64`, 0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    U64(u64),
    I64(i64),
    F64(f64),
}

impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Value::U64(v)
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::I64(v)
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::F64(v)
    }
}

/// One series of a family read with [`Family::counter_each`] or [`Family::gauge_each`]: its
/// label values, in the order of the family's label names, and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    labels: Vec<String>,
    value: Value,
}

impl Series {
    pub fn new<L: Into<String>>(
        labels: impl IntoIterator<Item = L>,
        value: impl Into<Value>,
    ) -> Self {
        Self {
            labels: labels.into_iter().map(Into::into).collect(),
            value: value.into(),
        }
    }
}

impl<T: 'static> Family<T> {
    /// A counter without labels.
    pub const fn counter(name: &'static str, help: &'static str, read: fn(&T) -> u64) -> Self {
        Self::new(name, help, Shape::One(Kind::Counter, ReadOne::Int(read)))
    }

    /// A gauge without labels.
    pub const fn gauge(name: &'static str, help: &'static str, read: fn(&T) -> u64) -> Self {
        Self::new(name, help, Shape::One(Kind::Gauge, ReadOne::Int(read)))
    }

    /// A gauge without labels whose value is not whole (seconds).
    pub const fn gauge_f64(name: &'static str, help: &'static str, read: fn(&T) -> f64) -> Self {
        Self::new(name, help, Shape::One(Kind::Gauge, ReadOne::Float(read)))
    }

    /// Counters told apart by `label`, one per `(value of the label, reader)`.
    pub const fn counter_by(
        name: &'static str,
        help: &'static str,
        label: &'static str,
        series: ByLabel<T>,
    ) -> Self {
        Self::new(name, help, Shape::By(Kind::Counter, label, series))
    }

    /// Gauges told apart by `label`, one per `(value of the label, reader)`.
    pub const fn gauge_by(
        name: &'static str,
        help: &'static str,
        label: &'static str,
        series: ByLabel<T>,
    ) -> Self {
        Self::new(name, help, Shape::By(Kind::Gauge, label, series))
    }

    /// Counters labelled by `labels`, as many as `read` finds at the scrape.
    pub const fn counter_each(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
        read: fn(&T) -> Vec<Series>,
    ) -> Self {
        Self::new(name, help, Shape::Each(Kind::Counter, labels, read))
    }

    /// Gauges labelled by `labels`, as many as `read` finds at the scrape.
    pub const fn gauge_each(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
        read: fn(&T) -> Vec<Series>,
    ) -> Self {
        Self::new(name, help, Shape::Each(Kind::Gauge, labels, read))
    }

    /// A histogram kept by the subsystem (observed where it happens).
    pub const fn histogram(
        name: &'static str,
        help: &'static str,
        read: fn(&T) -> &ShardedHistogram,
    ) -> Self {
        Self::new(name, help, Shape::Histogram(read))
    }

    const fn new(name: &'static str, help: &'static str, shape: Shape<T>) -> Self {
        Self { name, help, shape }
    }

    fn metric_type(&self) -> MetricType {
        match &self.shape {
            Shape::One(kind, _) | Shape::By(kind, ..) | Shape::Each(kind, ..) => match kind {
                Kind::Counter => MetricType::Counter,
                Kind::Gauge => MetricType::Gauge,
            },
            Shape::Histogram(_) => MetricType::Histogram,
        }
    }

    /// Writes the family's descriptor and its series as read from `from` now.
    fn encode(&self, from: &T, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut metric = e.encode_descriptor(self.name, self.help, None, self.metric_type())?;
        match &self.shape {
            Shape::One(kind, ReadOne::Int(read)) => encode(*kind, read(from).into(), metric),
            Shape::One(kind, ReadOne::Float(read)) => encode(*kind, read(from).into(), metric),
            Shape::By(kind, label, series) => {
                for (value_label, read) in *series {
                    let labels = [(*label, *value_label)];
                    encode(*kind, read(from).into(), metric.encode_family(&labels)?)?;
                }
                Ok(())
            }
            Shape::Each(kind, names, read) => {
                for sample in read(from) {
                    let labels: Vec<(&str, &str)> = names
                        .iter()
                        .copied()
                        .zip(sample.labels.iter().map(String::as_str))
                        .collect();
                    encode(*kind, sample.value, metric.encode_family(&labels)?)?;
                }
                Ok(())
            }
            Shape::Histogram(read) => read(from).encode(metric),
        }
    }
}

fn encode(kind: Kind, v: Value, e: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
    match (kind, v) {
        (Kind::Counter, Value::U64(v)) => ConstCounter::new(v).encode(e),
        (Kind::Counter, Value::I64(v)) => {
            ConstCounter::new(u64::try_from(v).unwrap_or(0)).encode(e)
        }
        (Kind::Counter, Value::F64(v)) => ConstCounter::new(v).encode(e),
        (Kind::Gauge, Value::U64(v)) => {
            ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX)).encode(e)
        }
        (Kind::Gauge, Value::I64(v)) => ConstGauge::new(v).encode(e),
        (Kind::Gauge, Value::F64(v)) => ConstGauge::new(v).encode(e),
    }
}

/// A table of families and what they are read from: the collector the registry calls at each
/// scrape.
pub(super) struct Scrape<T: 'static> {
    pub(super) families: &'static [Family<T>],
    pub(super) source: Arc<T>,
}

impl<T: Send + Sync + 'static> Collector for Scrape<T> {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in self.families {
            family.encode(&self.source, &mut e)?;
        }
        Ok(())
    }
}

impl<T> std::fmt::Debug for Scrape<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.families.iter().map(|family| family.name))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;
    use std::sync::atomic::{AtomicU64, Ordering};

    struct Counted {
        hits: AtomicU64,
        misses: AtomicU64,
        lag: ShardedHistogram,
        by_peer: Vec<(&'static str, i64)>,
    }

    const TABLE: &[Family<Counted>] = &[
        Family::counter("hits", "Hits.", |c| c.hits.load(Ordering::Relaxed)),
        Family::gauge("huge", "Past i64::MAX.", |_| u64::MAX),
        Family::gauge_f64("skew_seconds", "Skew.", |_| -0.25),
        Family::counter_by(
            "lookups",
            "Lookups by result.",
            "result",
            &[
                ("hit", |c| c.hits.load(Ordering::Relaxed)),
                ("miss", |c| c.misses.load(Ordering::Relaxed)),
            ],
        ),
        Family::gauge_each("offset", "By peer and side.", &["peer", "side"], |c| {
            c.by_peer
                .iter()
                .map(|&(peer, v)| Series::new([peer, "left"], v))
                .collect()
        }),
        Family::counter_each("seen", "By peer.", &["peer"], |c| {
            c.by_peer
                .iter()
                .map(|&(peer, v)| Series::new([peer], v))
                .collect()
        }),
        Family::histogram("lag_seconds", "Lag.", |c| &c.lag),
    ];

    fn scrape(counted: Counted) -> String {
        let mut registry = Registry::with_prefix("ringlimit");
        registry.register_collector(Box::new(Scrape {
            families: TABLE,
            source: Arc::new(counted),
        }));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encoded");
        text
    }

    #[test]
    fn every_shape_of_family_is_encoded_as_the_registry_encodes_it() {
        let counted = Counted {
            hits: AtomicU64::new(3),
            misses: AtomicU64::new(1),
            lag: ShardedHistogram::new([0.01]),
            by_peer: vec![("n1", 7), ("n2", -2)],
        };
        counted.lag.observe(0.005);
        let want = "\
# HELP ringlimit_hits Hits.
# TYPE ringlimit_hits counter
ringlimit_hits_total 3
# HELP ringlimit_huge Past i64::MAX.
# TYPE ringlimit_huge gauge
ringlimit_huge 9223372036854775807
# HELP ringlimit_skew_seconds Skew.
# TYPE ringlimit_skew_seconds gauge
ringlimit_skew_seconds -0.25
# HELP ringlimit_lookups Lookups by result.
# TYPE ringlimit_lookups counter
ringlimit_lookups_total{result=\"hit\"} 3
ringlimit_lookups_total{result=\"miss\"} 1
# HELP ringlimit_offset By peer and side.
# TYPE ringlimit_offset gauge
ringlimit_offset{peer=\"n1\",side=\"left\"} 7
ringlimit_offset{peer=\"n2\",side=\"left\"} -2
# HELP ringlimit_seen By peer.
# TYPE ringlimit_seen counter
ringlimit_seen_total{peer=\"n1\"} 7
ringlimit_seen_total{peer=\"n2\"} 0
# HELP ringlimit_lag_seconds Lag.
# TYPE ringlimit_lag_seconds histogram
ringlimit_lag_seconds_sum 0.005
ringlimit_lag_seconds_count 1
ringlimit_lag_seconds_bucket{le=\"0.01\"} 1
ringlimit_lag_seconds_bucket{le=\"+Inf\"} 1
# EOF
";
        assert_eq!(scrape(counted), want);
    }

    #[test]
    fn a_family_without_series_is_still_described() {
        let counted = Counted {
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            lag: ShardedHistogram::new([0.01]),
            by_peer: Vec::new(),
        };
        let text = scrape(counted);
        assert!(
            text.contains("# TYPE ringlimit_seen counter\n# HELP ringlimit_lag_seconds"),
            "{text}"
        );
    }
}
