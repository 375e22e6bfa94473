//! How a global bucket's windows are numbered, and how that numbering travels in the peer
//! protocol's `period_ms` field of a count.
//!
//! A rule of plain periods numbers its windows from the Unix epoch (`unix_ms / period_ms`), and
//! its counts carry `period_ms` itself. A calendar rule numbers them by its calendar
//! ([`ringlimit_core::calendar::index`]: local dates, Mondays or months since 1970), and its
//! counts carry a code far above any period (the top bit set, the unit, the zone's tag): a
//! node that does not know calendar windows refuses such a count as malformed, and is never
//! sent one (see [`ringlimit_proto::peer::GLOBAL_CALENDAR_SINCE`]). Either way consecutive
//! windows have consecutive numbers, so the window before `w` is `w - 1`.

use ringlimit_core::calendar::{self, Calendar, Unit, Zone};
use ringlimit_core::clock::NANOS_PER_MS;
use ringlimit_core::limiter::{MAX_PERIOD_NS, Rule};

/// The top bit of a calendar numbering's code.
const CALENDAR_BIT: u64 = 1 << 63;

/// A bucket's window numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Numbering {
    /// Windows of `period_ms` from the Unix epoch.
    Epoch { period_ms: u64 },
    /// A calendar's windows.
    Calendar(Calendar),
}

impl Numbering {
    /// The numbering of `rule`'s windows.
    pub fn of(rule: &Rule) -> Self {
        match rule.calendar {
            Some(c) => Numbering::Calendar(c),
            None => Numbering::Epoch {
                period_ms: rule.period_ns / NANOS_PER_MS,
            },
        }
    }

    /// What a count's `period_ms` carries.
    pub fn code(self) -> u64 {
        match self {
            Numbering::Epoch { period_ms } => period_ms,
            Numbering::Calendar(c) => {
                CALENDAR_BIT | u64::from(c.unit.code()) << 32 | u64::from(c.zone.tag())
            }
        }
    }

    /// The numbering a count's `period_ms` names, if it names one this node can number: a
    /// period within the rules' bounds, or a calendar of a known unit and zone.
    pub fn from_code(code: u64) -> Option<Self> {
        if code & CALENDAR_BIT == 0 {
            return (code > 0 && code <= MAX_PERIOD_NS / NANOS_PER_MS)
                .then_some(Numbering::Epoch { period_ms: code });
        }
        let unit = Unit::from_code(u8::try_from((code >> 32) & !(CALENDAR_BIT >> 32)).ok()?)?;
        let zone = Zone::by_tag(code as u32)?;
        Some(Numbering::Calendar(Calendar { unit, zone }))
    }

    /// Whether `code` names a calendar numbering (without resolving it).
    pub fn is_calendar(code: u64) -> bool {
        code & CALENDAR_BIT != 0
    }

    /// The number of the window containing `now` (ns since the epoch).
    pub fn window(self, now: u64) -> u64 {
        match self {
            Numbering::Epoch { period_ms } => now / period_ms.saturating_mul(NANOS_PER_MS).max(1),
            Numbering::Calendar(c) => calendar::index(c, now),
        }
    }

    /// The end (ns) of window `window`, saturating; `None` when the window starts beyond what
    /// ns since 1970 in a u64 reach (no real window).
    pub fn end(self, window: u64) -> Option<u64> {
        match self {
            Numbering::Epoch { period_ms } => {
                let p = period_ms.saturating_mul(NANOS_PER_MS);
                window.checked_mul(p)?;
                Some(window.saturating_add(1).saturating_mul(p))
            }
            Numbering::Calendar(c) => calendar::bounds_of_index(c, window).map(|(_, e)| e),
        }
    }

    /// The window, on a clock `offset_ns` ahead of the one `window` was numbered on, that
    /// holds the middle of `window`: how another region's count of `window` is numbered here
    /// (`offset_ns` is this clock minus the sender's). While the offset is under half a window
    /// that is `window` itself; `None` when either end is out of reach.
    pub fn translate(self, window: u64, offset_ns: i64) -> Option<u64> {
        let end = self.end(window)?;
        let start = match window.checked_sub(1) {
            Some(before) => self.end(before)?,
            None => 0,
        };
        let middle = start + end.saturating_sub(start) / 2;
        let moved = u64::try_from(i128::from(middle) + i128::from(offset_ns)).ok()?;
        Some(self.window(moved))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringlimit_core::rule::validate_calendar;
    use ringlimit_proto::Algorithm;

    fn at(s: &str) -> u64 {
        let z: jiff::Zoned = s.parse().expect("instant");
        u64::try_from(z.timestamp().as_nanosecond()).expect("after 1970")
    }

    #[test]
    fn plain_periods_travel_as_themselves_and_calendars_as_codes_no_period_has() {
        let plain = Numbering::Epoch { period_ms: 20_000 };
        assert_eq!(plain.code(), 20_000);
        assert_eq!(Numbering::from_code(20_000), Some(plain));
        assert_eq!(plain.window(40_000 * NANOS_PER_MS), 2);
        assert_eq!(plain.end(2), Some(60_000 * NANOS_PER_MS));
        assert_eq!(Numbering::from_code(0), None);

        let cal = Calendar {
            unit: Unit::Day,
            zone: Zone::parse("Europe/Berlin").expect("zone"),
        };
        let rule = validate_calendar(Algorithm::FixedWindow, 10, 0, None, Some(cal)).expect("rule");
        let n = Numbering::of(&rule);
        assert_eq!(n, Numbering::Calendar(cal));
        assert!(Numbering::is_calendar(n.code()));
        assert!(n.code() > MAX_PERIOD_NS);
        assert_eq!(Numbering::from_code(n.code()), Some(n));
        // Unknown unit or zone tag: not a numbering.
        assert_eq!(
            Numbering::from_code(CALENDAR_BIT | 9 << 32 | u64::from(cal.zone.tag())),
            None
        );
        assert_eq!(
            Numbering::from_code(CALENDAR_BIT | 1 << 32 | 0xdead_beef),
            None
        );
        // Berlin's 23-hour day: its window's end is the next local midnight.
        let w = n.window(at("2026-03-29T12:00[Europe/Berlin]"));
        assert_eq!(n.end(w), Some(at("2026-03-30T00:00[Europe/Berlin]")));
        assert_eq!(n.window(at("2026-03-30T00:00[Europe/Berlin]")), w + 1);
        assert_eq!(n.end(u64::MAX), None);
    }

    /// Another region's window lands where its middle falls on this clock: itself while the
    /// offset is under half a window, the next (or previous) beyond.
    #[test]
    fn windows_translate_by_the_offset_at_their_middle() {
        let ms = NANOS_PER_MS as i64;
        let plain = Numbering::Epoch { period_ms: 1_000 };
        assert_eq!(plain.translate(50, 0), Some(50));
        assert_eq!(plain.translate(50, 499 * ms), Some(50));
        assert_eq!(plain.translate(50, -499 * ms), Some(50));
        assert_eq!(plain.translate(50, 500 * ms), Some(51));
        assert_eq!(plain.translate(50, -501 * ms), Some(49));
        assert_eq!(plain.translate(50, 2_600 * ms), Some(53));
        // Before the epoch, or past what a u64 of ns reaches: no window.
        assert_eq!(plain.translate(0, -600 * ms), None);
        assert_eq!(plain.translate(u64::MAX, 0), None);
        let cal = Numbering::Calendar(Calendar {
            unit: Unit::Day,
            zone: Zone::parse("Europe/Berlin").expect("zone"),
        });
        let w = cal.window(at("2026-03-29T12:00[Europe/Berlin]"));
        assert_eq!(cal.translate(w, 3_600_000 * ms), Some(w));
        assert_eq!(cal.translate(w, 13 * 3_600_000 * ms), Some(w + 1));
    }
}
