//! An in-memory network for tests: nodes listen and dial by name over `tokio::io::duplex`
//! pipes, and a test can cut, stall and drop their links — so that forwarding, fail-open,
//! coalescing, relay and handover are tested without sockets, and (under tokio's paused clock)
//! without waiting.
//!
//! Names are addresses: a node listens on its name, and dials as its name.
//! - [`MemNet::cut`] / [`MemNet::heal`]: dials between two nodes are refused and their open
//!   connections break (reads and writes fail).
//! - [`MemNet::stall`] / [`MemNet::resume`]: bytes to and from a node stop moving (nothing is
//!   lost) — a paused process; new connections to it are accepted but stall too.
//! - [`MemNet::drop_connections`]: every open connection of a node breaks; new dials work.

use super::dial::Dial;
use super::framing::BoxedIo;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tokio::sync::mpsc;

/// Bytes a pipe buffers each way.
const PIPE_BYTES: usize = 256 * 1024;

/// An in-memory network. Clones share it.
#[derive(Clone, Default)]
pub struct MemNet {
    state: Arc<Mutex<NetState>>,
}

#[derive(Default)]
struct NetState {
    listeners: HashMap<String, mpsc::UnboundedSender<(BoxedIo, String)>>,
    /// Pairs that cannot reach each other, `(a, b)` with `a <= b`.
    cut: HashSet<(String, String)>,
    stalled: HashSet<String>,
    /// Open connections, by their two ends' names.
    links: Vec<(String, String, Weak<Gate>)>,
    dials: HashMap<String, u64>,
}

fn pair(a: &str, b: &str) -> (String, String) {
    if a <= b {
        (a.to_owned(), b.to_owned())
    } else {
        (b.to_owned(), a.to_owned())
    }
}

impl NetState {
    /// Open links touching `node` (and `other`, if given); forgets closed ones.
    fn links_of(&mut self, node: &str, other: Option<&str>) -> Vec<Arc<Gate>> {
        self.links.retain(|(_, _, g)| g.strong_count() > 0);
        self.links
            .iter()
            .filter(|(a, b, _)| match other {
                None => a == node || b == node,
                Some(o) => (a == node && b == o) || (a == o && b == node),
            })
            .filter_map(|(_, _, g)| g.upgrade())
            .collect()
    }
}

impl MemNet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Listens on `addr` (replacing any earlier listener there).
    pub fn listen(&self, addr: &str) -> MemListener {
        let (tx, rx) = mpsc::unbounded_channel();
        self.state.lock().listeners.insert(addr.to_owned(), tx);
        MemListener { rx }
    }

    /// A dialer for node `from`.
    pub fn dialer(&self, from: &str) -> Arc<dyn Dial> {
        Arc::new(MemDial {
            net: self.clone(),
            from: from.to_owned(),
        })
    }

    /// `a` and `b` can no longer reach each other: dials fail, open connections break.
    pub fn cut(&self, a: &str, b: &str) {
        let mut st = self.state.lock();
        st.cut.insert(pair(a, b));
        for gate in st.links_of(a, Some(b)) {
            gate.set(|g| g.broken = true);
        }
    }

    /// `a` and `b` reach each other again (connections broken by the cut stay broken).
    pub fn heal(&self, a: &str, b: &str) {
        self.state.lock().cut.remove(&pair(a, b));
    }

    /// Bytes to and from `node` stop moving, as if its process were paused.
    pub fn stall(&self, node: &str) {
        let mut st = self.state.lock();
        st.stalled.insert(node.to_owned());
        for gate in st.links_of(node, None) {
            gate.set(|g| g.stalled = true);
        }
    }

    /// Bytes to and from `node` move again; what was sent meanwhile arrives.
    pub fn resume(&self, node: &str) {
        let mut st = self.state.lock();
        st.stalled.remove(node);
        let stalled = st.stalled.clone();
        for (a, b, gate) in st.links.clone() {
            if (a == node || b == node)
                && !stalled.contains(&a)
                && !stalled.contains(&b)
                && let Some(gate) = gate.upgrade()
            {
                gate.set(|g| g.stalled = false);
            }
        }
    }

    /// Every open connection of `node` breaks; new ones can be made.
    pub fn drop_connections(&self, node: &str) {
        let mut st = self.state.lock();
        for gate in st.links_of(node, None) {
            gate.set(|g| g.broken = true);
        }
    }

    /// Connections opened to `addr` so far.
    pub fn dials(&self, addr: &str) -> u64 {
        self.state.lock().dials.get(addr).copied().unwrap_or(0)
    }

    fn connect(&self, from: &str, to: &str) -> io::Result<BoxedIo> {
        let mut st = self.state.lock();
        if st.cut.contains(&pair(from, to)) {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("{from} cannot reach {to}"),
            ));
        }
        let refused = || {
            io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("nothing listens on {to}"),
            )
        };
        let listener = st.listeners.get(to).ok_or_else(refused)?.clone();
        let gate = Arc::new(Gate::default());
        if st.stalled.contains(from) || st.stalled.contains(to) {
            gate.set(|g| g.stalled = true);
        }
        let (near, far) = tokio::io::duplex(PIPE_BYTES);
        let far = MemStream {
            io: far,
            gate: gate.clone(),
        };
        listener
            .send((Box::new(far), from.to_owned()))
            .map_err(|_| refused())?;
        st.links
            .push((from.to_owned(), to.to_owned(), Arc::downgrade(&gate)));
        *st.dials.entry(to.to_owned()).or_default() += 1;
        Ok(Box::new(MemStream { io: near, gate }))
    }
}

/// Connections made to one address.
pub struct MemListener {
    rx: mpsc::UnboundedReceiver<(BoxedIo, String)>,
}

impl MemListener {
    /// The next connection and the name of the node that dialed; `None` once the network is
    /// gone.
    pub async fn accept(&mut self) -> Option<(BoxedIo, String)> {
        self.rx.recv().await
    }
}

struct MemDial {
    net: MemNet,
    from: String,
}

impl Dial for MemDial {
    fn dial(&self, addr: &str) -> BoxFuture<'static, io::Result<BoxedIo>> {
        let conn = self.net.connect(&self.from, addr);
        Box::pin(async move { conn })
    }
}

/// The state both ends of one connection share.
#[derive(Default)]
struct Gate {
    inner: Mutex<GateState>,
}

#[derive(Default)]
struct GateState {
    broken: bool,
    stalled: bool,
    /// Tasks that polled either end: woken on every change, so that a task parked in the pipe
    /// itself still sees a break or a resume.
    wakers: Vec<Waker>,
}

impl Gate {
    fn set(&self, change: impl FnOnce(&mut GateState)) {
        let wakers = {
            let mut g = self.inner.lock();
            change(&mut g);
            std::mem::take(&mut g.wakers)
        };
        wakers.into_iter().for_each(Waker::wake);
    }

    /// Ready when bytes may move; an error once the link is broken.
    fn poll(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut g = self.inner.lock();
        if !g.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            g.wakers.push(cx.waker().clone());
        }
        if g.broken {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "link broken",
            )));
        }
        if g.stalled {
            return Poll::Pending;
        }
        Poll::Ready(Ok(()))
    }
}

/// One end of a connection.
struct MemStream {
    io: DuplexStream,
    gate: Arc<Gate>,
}

impl AsyncRead for MemStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        std::task::ready!(self.gate.poll(cx))?;
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for MemStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        std::task::ready!(self.gate.poll(cx))?;
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.gate.poll(cx))?;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
