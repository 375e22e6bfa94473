//! Serving the HTTP API on dedicated single-threaded runtimes.
//!
//! Why: on the multi-threaded runtime the HTTP path spent most of its time in the kernel waking
//! and switching worker threads (perf: `_raw_spin_unlock_irqrestore`, `finish_task_switch` on
//! top), not in ringlimit or hyper. N current-thread runtimes, each accepting from the same
//! listening socket and keeping its connections, never hand a request to another thread:
//! `wrk -t2 -c32` on 2 cores went from 94–97k to 126–139k checks/s (3 runs each, same binary).
//! The rest of the node (peer RPC, gossip) stays on the main runtime; channels and the shared
//! state work across runtimes.

use std::future::Future;
use std::io;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Serves `app` on `listener` until `shutdown` completes, then drains. With `threads == 0` on
/// the caller's runtime; otherwise on `threads` OS threads each running a current-thread
/// runtime (they stop when `shutdown` completes, so drive this future to completion: aborting
/// it would leave them serving).
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    threads: usize,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    if threads == 0 {
        return axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await;
    }
    let listener = listener.into_std()?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut workers = Vec::with_capacity(threads);
    for i in 0..threads {
        let listener = listener.try_clone()?;
        let app = app.clone();
        let mut stop = stop_rx.clone();
        let worker = std::thread::Builder::new()
            .name(format!("ringlimit-http-{i}"))
            .spawn(move || -> io::Result<()> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                runtime.block_on(async move {
                    let listener = TcpListener::from_std(listener)?;
                    axum::serve(listener, app)
                        .with_graceful_shutdown(async move {
                            let _ = stop.wait_for(|stopped| *stopped).await;
                        })
                        .await
                })
            })?;
        workers.push(worker);
    }
    drop(listener);
    // A worker that fails (its runtime cannot start, accept breaks) ends the node like the
    // single-runtime server would; otherwise wait for the shutdown signal.
    let (failed_tx, mut failed_rx) = tokio::sync::mpsc::channel::<io::Error>(threads);
    let watchers: Vec<_> = workers
        .into_iter()
        .map(|w| {
            let failed = failed_tx.clone();
            tokio::task::spawn_blocking(move || {
                let result = w
                    .join()
                    .unwrap_or_else(|_| Err(io::Error::other("HTTP worker thread panicked")));
                if let Err(e) = &result {
                    let _ = failed.try_send(io::Error::new(e.kind(), e.to_string()));
                }
                result
            })
        })
        .collect();
    drop(failed_tx);
    let early = tokio::select! {
        () = shutdown => None,
        Some(e) = failed_rx.recv() => Some(e),
    };
    let _ = stop_tx.send(true);
    for w in watchers {
        if let Ok(Err(e)) = w.await
            && early.is_none()
        {
            return Err(e);
        }
    }
    early.map_or(Ok(()), Err)
}
