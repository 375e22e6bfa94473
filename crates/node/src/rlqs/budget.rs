//! What the RLQS streams of this node may hold, and who gives way when it is full. Pure: the
//! accounting and the decisions; [`super::Rlqs`] applies them.
//!
//! Everything a stream holds is charged to its client (the connection's source address): the
//! stream itself, its buckets (their ids' bytes and a fixed part) and the abandons waiting for its
//! Envoy to read them. A stream may hold at most [`Limits::stream_buckets`] buckets and
//! [`Limits::stream_bytes`] bytes; the node at most [`Limits::node_buckets`] and
//! [`Limits::node_bytes`]. While the node has room, a client may take more than its fair share
//! (the node's limit over the clients holding anything, itself counted). When the node is full, a
//! client within its fair share is still admitted: the client holding the most (necessarily over
//! its share) gives way; a client at its share is refused. So one client (or many streams of
//! one) cannot keep another's first buckets out.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;

/// The bounds of RLQS state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most buckets one stream may hold.
    pub stream_buckets: usize,
    /// Most accounted bytes one stream may hold.
    pub stream_bytes: usize,
    /// Most buckets all the streams of this node may hold.
    pub node_buckets: usize,
    /// Most accounted bytes all the streams of this node may hold.
    pub node_bytes: usize,
}

/// What a stream, a client or the node holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Use {
    pub buckets: usize,
    pub bytes: usize,
}

impl Use {
    pub fn bytes(bytes: usize) -> Self {
        Self { buckets: 0, bytes }
    }

    pub fn plus(self, o: Use) -> Self {
        Self {
            buckets: self.buckets.saturating_add(o.buckets),
            bytes: self.bytes.saturating_add(o.bytes),
        }
    }

    pub fn minus(self, o: Use) -> Self {
        Self {
            buckets: self.buckets.saturating_sub(o.buckets),
            bytes: self.bytes.saturating_sub(o.bytes),
        }
    }

    fn is_zero(self) -> bool {
        self == Self::default()
    }
}

/// Which limit a client must give way for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dim {
    Buckets,
    Bytes,
}

/// Why something was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The stream holds its most buckets or bytes.
    Stream,
    /// The node is full and the client holds its fair share.
    Share,
}

/// The answer to a request for room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    Yes,
    /// The node is full: this client (over its share) gives way in `Dim`, then ask again.
    Evict(IpAddr, Dim),
    Refused(Refusal),
}

/// The node's RLQS accounting, per client.
#[derive(Debug)]
pub struct Budget {
    limits: Limits,
    total: Use,
    clients: HashMap<IpAddr, Use>,
    /// `(buckets, client)` and `(bytes, client)` of every client: who holds the most.
    by_buckets: BTreeSet<(usize, IpAddr)>,
    by_bytes: BTreeSet<(usize, IpAddr)>,
}

impl Budget {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            total: Use::default(),
            clients: HashMap::new(),
            by_buckets: BTreeSet::new(),
            by_bytes: BTreeSet::new(),
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// What the node holds.
    pub fn total(&self) -> Use {
        self.total
    }

    /// Clients holding anything.
    pub fn clients(&self) -> usize {
        self.clients.len()
    }

    /// What `client` holds.
    pub fn of(&self, client: IpAddr) -> Use {
        self.clients.get(&client).copied().unwrap_or_default()
    }

    fn set(&mut self, client: IpAddr, now: Use) {
        let was = self.of(client);
        self.by_buckets.remove(&(was.buckets, client));
        self.by_bytes.remove(&(was.bytes, client));
        if now.is_zero() {
            self.clients.remove(&client);
        } else {
            self.clients.insert(client, now);
            self.by_buckets.insert((now.buckets, client));
            self.by_bytes.insert((now.bytes, client));
        }
    }

    /// Charges `u` to `client`.
    pub fn add(&mut self, client: IpAddr, u: Use) {
        self.total = self.total.plus(u);
        self.set(client, self.of(client).plus(u));
    }

    /// Gives back `u` charged to `client`.
    pub fn sub(&mut self, client: IpAddr, u: Use) {
        self.total = self.total.minus(u);
        self.set(client, self.of(client).minus(u));
    }

    /// Whether `cost` fits in a stream holding `stream` and in the node as it is (nobody gives
    /// way): for what may be left out, such as an abandon.
    pub fn fits(&self, stream: Use, cost: Use) -> bool {
        let l = self.limits;
        let s = stream.plus(cost);
        let t = self.total.plus(cost);
        s.buckets <= l.stream_buckets
            && s.bytes <= l.stream_bytes
            && t.buckets <= l.node_buckets
            && t.bytes <= l.node_bytes
    }

    /// `client`'s fair share: the node's limits over the clients holding anything, `client`
    /// counted.
    pub fn share(&self, client: IpAddr) -> Use {
        let n = self.clients.len() + usize::from(!self.clients.contains_key(&client));
        Use {
            buckets: self.limits.node_buckets / n.max(1),
            bytes: self.limits.node_bytes / n.max(1),
        }
    }

    /// May `client` add `cost`, to a stream holding `stream` (`None`: a new stream)?
    pub fn admit(&self, client: IpAddr, stream: Option<Use>, cost: Use) -> Admit {
        let l = self.limits;
        if let Some(s) = stream {
            let s = s.plus(cost);
            if s.buckets > l.stream_buckets || s.bytes > l.stream_bytes {
                return Admit::Refused(Refusal::Stream);
            }
        }
        let t = self.total.plus(cost);
        let full_buckets = cost.buckets > 0 && t.buckets > l.node_buckets;
        let full_bytes = cost.bytes > 0 && t.bytes > l.node_bytes;
        if !full_buckets && !full_bytes {
            return Admit::Yes;
        }
        let share = self.share(client);
        let mine = self.of(client).plus(cost);
        if mine.buckets > share.buckets || mine.bytes > share.bytes {
            return Admit::Refused(Refusal::Share);
        }
        // Whoever holds the most is over its share (the others and this client together are
        // within theirs, so the node would not be full): it gives way.
        let (most, dim, over) = if full_buckets {
            (self.by_buckets.last(), Dim::Buckets, share.buckets)
        } else {
            (self.by_bytes.last(), Dim::Bytes, share.bytes)
        };
        match most {
            Some(&(held, victim)) if held > over && victim != client => Admit::Evict(victim, dim),
            _ => Admit::Refused(Refusal::Share),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(i: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, i])
    }

    const LIMITS: Limits = Limits {
        stream_buckets: 10,
        stream_bytes: 1000,
        node_buckets: 20,
        node_bytes: 2000,
    };

    fn bucket(bytes: usize) -> Use {
        Use { buckets: 1, bytes }
    }

    #[test]
    fn room_is_taken_while_there_is_some() {
        let mut b = Budget::new(LIMITS);
        for _ in 0..20 {
            assert_eq!(b.admit(ip(1), Some(Use::default()), bucket(10)), Admit::Yes);
            b.add(ip(1), bucket(10));
        }
        assert_eq!(
            b.total(),
            Use {
                buckets: 20,
                bytes: 200
            }
        );
        // A stream at its most is refused whatever the node holds.
        let full_stream = Use {
            buckets: 10,
            bytes: 100,
        };
        assert_eq!(
            b.admit(ip(2), Some(full_stream), bucket(10)),
            Admit::Refused(Refusal::Stream)
        );
        let big_stream = Use {
            buckets: 1,
            bytes: 995,
        };
        assert_eq!(
            b.admit(ip(2), Some(big_stream), bucket(10)),
            Admit::Refused(Refusal::Stream)
        );
    }

    #[test]
    fn a_full_node_makes_the_biggest_client_give_way_to_one_within_its_share() {
        let mut b = Budget::new(LIMITS);
        b.add(
            ip(1),
            Use {
                buckets: 20,
                bytes: 200,
            },
        );
        // ip(2)'s share is 10 buckets: ip(1) (over it) gives way.
        assert_eq!(
            b.admit(ip(2), Some(Use::default()), bucket(10)),
            Admit::Evict(ip(1), Dim::Buckets)
        );
        // ip(1) itself, over its share, is refused.
        assert_eq!(
            b.admit(ip(1), Some(Use::default()), bucket(10)),
            Admit::Refused(Refusal::Share)
        );
        b.sub(
            ip(1),
            Use {
                buckets: 10,
                bytes: 100,
            },
        );
        b.add(
            ip(2),
            Use {
                buckets: 10,
                bytes: 100,
            },
        );
        // Both at their share: neither gets more.
        for c in [ip(1), ip(2)] {
            assert_eq!(
                b.admit(c, Some(Use::default()), bucket(10)),
                Admit::Refused(Refusal::Share)
            );
        }
        // A third client's share is 6: either gives way.
        assert!(matches!(
            b.admit(ip(3), Some(Use::default()), bucket(10)),
            Admit::Evict(_, Dim::Buckets)
        ));
        assert_eq!(b.clients(), 2);
        b.sub(
            ip(2),
            Use {
                buckets: 10,
                bytes: 100,
            },
        );
        assert_eq!(b.clients(), 1);
        assert_eq!(b.of(ip(2)), Use::default());
    }

    #[test]
    fn bytes_are_shared_like_buckets() {
        let mut b = Budget::new(LIMITS);
        b.add(
            ip(1),
            Use {
                buckets: 2,
                bytes: 1990,
            },
        );
        assert_eq!(
            b.admit(ip(2), Some(Use::default()), bucket(100)),
            Admit::Evict(ip(1), Dim::Bytes)
        );
        // A new stream is bytes only: the same.
        assert_eq!(
            b.admit(ip(2), None, Use::bytes(100)),
            Admit::Evict(ip(1), Dim::Bytes)
        );
        // Over its byte share (1000, with what its other streams hold), refused.
        b.add(ip(2), Use::bytes(200));
        assert_eq!(
            b.admit(ip(2), Some(Use::default()), bucket(900)),
            Admit::Refused(Refusal::Share)
        );
        b.sub(ip(2), Use::bytes(200));
        // What fits as it is.
        assert!(b.fits(Use::default(), Use::bytes(10)));
        assert!(!b.fits(Use::default(), Use::bytes(11)));
    }
}
