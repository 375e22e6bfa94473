//! Calendar windows: a day, week or month in an IANA time zone, as rules name them.
//!
//! A [`Calendar`] is `Copy` and two bytes of index so that a rule carrying one stays as small
//! and cheap to copy as any other: its zone is an index into a process-wide table of the zones
//! in use, filled only with names the bundled time-zone database knows (so the table is bounded
//! by the database's size, whatever a peer or a request sends). On the wire and in JSON a zone
//! travels by its IANA name, never by its index.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::sync::{LazyLock, RwLock};

/// The length of a calendar window: which boundaries it is aligned to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unit {
    /// Local midnight to local midnight (23 to 25 hours across a DST change).
    Day,
    /// Monday 00:00 local to the next Monday 00:00.
    Week,
    /// The first of the month 00:00 local to the first of the next (28 to 31 days).
    Month,
}

impl Unit {
    /// The stable code on the wire.
    pub fn code(self) -> u8 {
        match self {
            Unit::Day => 1,
            Unit::Week => 2,
            Unit::Month => 3,
        }
    }

    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Unit::Day),
            2 => Some(Unit::Week),
            3 => Some(Unit::Month),
            _ => None,
        }
    }

    /// The period as the rules file writes it.
    pub fn period(self) -> &'static str {
        match self {
            Unit::Day => "1d",
            Unit::Week => "1w",
            Unit::Month => "1mo",
        }
    }

    /// The nominal length in ns: a day and a week as the non-calendar periods count them, a
    /// month as its longest (31 days). What a calendar rule's `period_ns` holds, for what needs
    /// one number (its bounds, leases, the listing); the windows themselves come from
    /// the calendar.
    pub fn nominal_ns(self) -> u64 {
        const DAY: u64 = 86_400 * 1_000_000_000;
        match self {
            Unit::Day => DAY,
            Unit::Week => 7 * DAY,
            Unit::Month => 31 * DAY,
        }
    }
}

/// A time zone of the bundled IANA database, as an index into this process's table of zones
/// in use (see the module's doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Zone(u16);

/// A time zone the database does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a time zone of the IANA database (write e.g. \"Europe/Berlin\" or \"UTC\")")]
pub struct UnknownZone(pub String);

struct Entry {
    name: &'static str,
    tz: jiff::tz::TimeZone,
    tag: u32,
}

/// The zones in use; index 0 is UTC. Only names the database resolves are added, at most once.
static ZONES: LazyLock<RwLock<Vec<Entry>>> = LazyLock::new(|| {
    RwLock::new(vec![Entry {
        name: "UTC",
        tz: jiff::tz::TimeZone::UTC,
        tag: fnv("UTC"),
    }])
});

fn fnv(s: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    h
}

impl Zone {
    pub const UTC: Zone = Zone(0);

    /// The zone of the IANA name `name` (as the database spells it, any case).
    pub fn parse(name: &str) -> Result<Zone, UnknownZone> {
        let unknown = || UnknownZone(name.to_owned());
        if name.is_empty() || name.len() > 64 {
            return Err(unknown());
        }
        if let Some(z) = Self::find(name) {
            return Ok(z);
        }
        let tz = jiff::tz::db().get(name).map_err(|_| unknown())?;
        // The database's own spelling, so that `europe/berlin` and `Europe/Berlin` are one zone.
        let canonical = tz.iana_name().unwrap_or(name).to_owned();
        let mut zones = ZONES.write().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = zones
            .iter()
            .position(|e| e.name.eq_ignore_ascii_case(&canonical))
        {
            return Ok(Zone(i as u16));
        }
        let i = u16::try_from(zones.len()).map_err(|_| unknown())?;
        let tag = fnv(&canonical);
        // Bounded by the database's size (only names it resolves get here, each once).
        let name: &'static str = Box::leak(canonical.into_boxed_str());
        zones.push(Entry { name, tz, tag });
        Ok(Zone(i))
    }

    fn find(name: &str) -> Option<Zone> {
        let zones = ZONES.read().unwrap_or_else(|e| e.into_inner());
        zones
            .iter()
            .position(|e| e.name.eq_ignore_ascii_case(name))
            .map(|i| Zone(i as u16))
    }

    fn with<T>(self, f: impl FnOnce(&Entry) -> T) -> T {
        let zones = ZONES.read().unwrap_or_else(|e| e.into_inner());
        // A Zone is only made by `parse`, so its index is in the table.
        f(&zones[usize::from(self.0)])
    }

    /// The IANA name.
    pub fn name(self) -> &'static str {
        self.with(|e| e.name)
    }

    /// The zone's rules (cheap: a shared handle).
    pub fn tz(self) -> jiff::tz::TimeZone {
        self.with(|e| e.tz.clone())
    }

    /// The zone whose [`Zone::tag`] is `tag`: one in use, else one of the database (looked up
    /// by hashing its names: a few hundred, done once per zone since the match is then in use).
    pub fn by_tag(tag: u32) -> Option<Zone> {
        let known = {
            let zones = ZONES.read().unwrap_or_else(|e| e.into_inner());
            zones.iter().position(|e| e.tag == tag)
        };
        if let Some(i) = known {
            return u16::try_from(i).ok().map(Zone);
        }
        let name = jiff::tz::db()
            .available()
            .find(|n| fnv(n.as_str()) == tag)?;
        Zone::parse(name.as_str()).ok()
    }

    /// A fingerprint of the name, the same in every process.
    pub fn tag(self) -> u32 {
        self.with(|e| e.tag)
    }
}

/// Calendar windows of a fixed-window rule: `unit`s aligned in `zone`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Calendar {
    pub unit: Unit,
    pub zone: Zone,
}

/// How a calendar travels: its unit's code and its zone's name.
#[derive(Serialize, Deserialize)]
struct CalendarWire {
    unit: u8,
    zone: String,
}

impl Serialize for Calendar {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        CalendarWire {
            unit: self.unit.code(),
            zone: self.zone.name().to_owned(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Calendar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let w = CalendarWire::deserialize(d)?;
        let unit = Unit::from_code(w.unit)
            .ok_or_else(|| D::Error::custom(format!("unknown calendar unit {}", w.unit)))?;
        let zone = Zone::parse(&w.zone).map_err(D::Error::custom)?;
        Ok(Calendar { unit, zone })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Zones travel in global counts by their tag: no two names of the database share one.
    #[test]
    fn every_zone_of_the_database_has_its_own_tag() {
        let mut tags = std::collections::HashMap::new();
        for name in jiff::tz::db().available() {
            if let Some(other) = tags.insert(fnv(name.as_str()), name.as_str().to_owned()) {
                // Aliases of one zone may share nothing but a canonical name; names differ here.
                panic!("{other} and {} share a tag", name.as_str());
            }
        }
        assert!(tags.len() > 300, "{}", tags.len());
    }

    #[test]
    fn zones_are_interned_by_their_database_name_and_unknown_ones_refused() {
        let a = Zone::parse("Europe/Berlin").unwrap();
        let b = Zone::parse("europe/berlin").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.name(), "Europe/Berlin");
        assert_eq!(Zone::parse("UTC").unwrap(), Zone::UTC);
        assert!(Zone::parse("Mars/Olympus_Mons").is_err());
        assert!(Zone::parse("").is_err());
        let c = Calendar {
            unit: Unit::Month,
            zone: a,
        };
        assert_eq!(Zone::by_tag(a.tag()), Some(a));
        let kolkata = fnv("Asia/Kolkata");
        assert_eq!(Zone::by_tag(kolkata).map(Zone::name), Some("Asia/Kolkata"));
        assert_eq!(Zone::by_tag(fnv("Mars/Olympus_Mons")), None);
        let bytes = bincode::serde::encode_to_vec(c, bincode::config::standard()).unwrap();
        let (back, _): (Calendar, _) =
            bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).unwrap();
        assert_eq!(back, c);
    }
}
