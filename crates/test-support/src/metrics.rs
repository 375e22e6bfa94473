//! Values read from a node's `/metrics` text (Prometheus' text format).

/// The value of one series: `series` is its name and labels exactly as exported
/// (`ringlimit_buckets`, `ringlimit_tls_reload_total{result="error"}`); a trailing space is
/// ignored. `None` when the text has no such series (a name that only begins another's, such
/// as `ringlimit_buckets` of `ringlimit_buckets_total`, is not it).
pub fn series(text: &str, series: &str) -> Option<f64> {
    let series = series.trim_end();
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// The sum of every series of the family `name`, whatever their labels; `None` when there is
/// none.
pub fn series_sum(text: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = text
        .lines()
        .filter(|l| l.split([' ', '{']).next() == Some(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP ringlimit_buckets Buckets held.\n\
                        # TYPE ringlimit_buckets gauge\n\
                        ringlimit_buckets_total 9\n\
                        ringlimit_buckets 3\n\
                        ringlimit_reload_total{result=\"ok\"} 2\n\
                        ringlimit_reload_total{result=\"error\"} 1\n";

    #[test]
    fn a_series_by_its_exact_name_and_labels() {
        assert_eq!(series(TEXT, "ringlimit_buckets"), Some(3.0));
        assert_eq!(series(TEXT, "ringlimit_buckets "), Some(3.0));
        assert_eq!(series(TEXT, "ringlimit_buckets_total"), Some(9.0));
        assert_eq!(
            series(TEXT, "ringlimit_reload_total{result=\"error\"}"),
            Some(1.0)
        );
        assert_eq!(series(TEXT, "ringlimit_reload_total"), None);
        assert_eq!(series(TEXT, "ringlimit_bucket"), None);
    }

    #[test]
    fn a_family_summed_over_its_labels() {
        assert_eq!(series_sum(TEXT, "ringlimit_reload_total"), Some(3.0));
        assert_eq!(series_sum(TEXT, "ringlimit_buckets"), Some(3.0));
        assert_eq!(series_sum(TEXT, "ringlimit_nothing"), None);
    }
}
