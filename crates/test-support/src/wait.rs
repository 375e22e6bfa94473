//! Bounded waits on a condition: what a test does instead of sleeping out a timeout.

use anyhow::{Result, anyhow};
use std::future::Future;
use std::time::Duration;

/// How often a condition is polled.
pub const POLL: Duration = Duration::from_millis(10);

/// Polls `condition` every [`POLL`] until it holds; fails once `within` has passed, naming
/// `what` (with the condition's last error, if its last poll failed). A poll still running
/// at the bound is dropped: a condition that hangs cannot make the wait longer.
pub async fn wait_until<F, Fut>(what: &str, within: Duration, mut condition: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    poll_every(POLL, what, within, || {
        let holds = condition();
        async { Ok(holds.await?.then_some(())) }
    })
    .await
}

/// [`wait_until`] for a condition that holds with a value (`Some`): returns it.
pub async fn wait_for<T, F, Fut>(what: &str, within: Duration, poll: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    poll_every(POLL, what, within, poll).await
}

/// [`wait_for`], polling every `every` (a test that times how soon something happens polls
/// finer than [`POLL`]).
pub async fn poll_every<T, F, Fut>(
    every: Duration,
    what: &str,
    within: Duration,
    mut poll: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let mut last_error = None;
    let polled = tokio::time::timeout(within, async {
        loop {
            match poll().await {
                Ok(Some(value)) => return value,
                Ok(None) => last_error = None,
                Err(e) => last_error = Some(e),
            }
            tokio::time::sleep(every).await;
        }
    })
    .await;
    match (polled, last_error) {
        (Ok(value), _) => Ok(value),
        (Err(_), Some(e)) => Err(e.context(format!("{what}: not met within {within:?}"))),
        (Err(_), None) => Err(anyhow!("{what}: not met within {within:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[tokio::test(start_paused = true)]
    async fn holds_once_the_condition_does() {
        let polls = Cell::new(0);
        let start = tokio::time::Instant::now();
        wait_until("the third poll", Duration::from_secs(1), || async {
            polls.set(polls.get() + 1);
            Ok(polls.get() == 3)
        })
        .await
        .expect("met");
        assert_eq!(polls.get(), 3);
        assert_eq!(start.elapsed(), 2 * POLL);
    }

    #[tokio::test(start_paused = true)]
    async fn fails_at_the_bound_naming_what_and_the_last_error() {
        let start = tokio::time::Instant::now();
        let e = wait_until("never", Duration::from_millis(100), || async {
            Err::<bool, _>(anyhow!("no answer"))
        })
        .await
        .expect_err("never met");
        assert_eq!(start.elapsed(), Duration::from_millis(100));
        let text = format!("{e:#}");
        assert!(text.contains("never: not met within 100ms"), "{text}");
        assert!(text.contains("no answer"), "{text}");
        // A false condition after an error forgets the error.
        let calls = Cell::new(0);
        let e = wait_until("false", Duration::from_millis(50), || async {
            calls.set(calls.get() + 1);
            if calls.get() == 1 {
                Err(anyhow!("first"))
            } else {
                Ok(false)
            }
        })
        .await
        .expect_err("never met");
        assert_eq!(format!("{e:#}"), "false: not met within 50ms");
    }

    #[tokio::test(start_paused = true)]
    async fn a_value_once_there_is_one_polled_as_often_as_asked() {
        let polls = Cell::new(0u32);
        let start = tokio::time::Instant::now();
        let got = poll_every(
            Duration::from_millis(5),
            "the fourth poll",
            Duration::from_secs(1),
            || async {
                polls.set(polls.get() + 1);
                Ok((polls.get() == 4).then_some("four"))
            },
        )
        .await
        .expect("met");
        assert_eq!(got, "four");
        assert_eq!(start.elapsed(), Duration::from_millis(15));
        let got = wait_for("at once", Duration::from_secs(1), || async { Ok(Some(7)) }).await;
        assert_eq!(got.expect("met"), 7);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_poll_is_cut_at_the_bound() {
        let start = tokio::time::Instant::now();
        let e = wait_until("hangs", Duration::from_secs(2), || async {
            std::future::pending::<()>().await;
            Ok(true)
        })
        .await
        .expect_err("cut");
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        assert!(format!("{e}").contains("hangs"));
    }
}
