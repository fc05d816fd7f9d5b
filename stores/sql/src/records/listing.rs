//! A listing of records ([`Store::records`](idemcache::store::Store::records)) as pages
//! of the dialects' `RECORDS` statement: [`Listing`] holds where the next page starts
//! and what was found, a driver runs the statement with its bounds until it says done.
//! Also [`removal_mask`] for the dialects' removals.
//!
//! Invariant: every row is judged with `idemcache::store::record::judge` at the now its
//! statement read, and kept only if the filter selects it; the next page starts past
//! the last row read (selected or not), so no row is read twice and none is skipped;
//! a listing ends when it holds `limit` records or a page comes back short.

use idemcache::store::record::{judge, prefix_end, StoredRecord};
use idemcache::store::{Record, RecordFilter, RecordState, StoreError};
use idemcache::Key;

/// The most rows one page of a listing asks for.
const PAGE: usize = 500;

/// A listing under way (see the module docs).
#[derive(Debug)]
pub struct Listing {
    filter: RecordFilter,
    limit: usize,
    lapse_ttl: i64,
    from: Vec<u8>,
    below: Option<Vec<u8>>,
    suffix: Vec<u8>,
    out: Vec<Record>,
    done: bool,
}

impl Listing {
    /// The listing of up to `limit` records `filter` selects after `after`, judged under
    /// the unknown TTL `lapse_ttl` (µs, 0 under `TakeOver`).
    pub fn new(
        filter: &RecordFilter,
        after: Option<&Key>,
        limit: usize,
        lapse_ttl: i64,
    ) -> Listing {
        let after = after.map(|k| k.as_bytes().to_vec()).unwrap_or_default();
        let prefix = filter.key_prefix();
        // Every key of the prefix's range sorts after the prefix itself.
        let from = match &prefix {
            Some(prefix) if *prefix > after => prefix.clone(),
            _ => after,
        };
        Listing {
            below: prefix.as_deref().and_then(prefix_end),
            suffix: filter.key_suffix().unwrap_or_default(),
            filter: filter.clone(),
            limit,
            lapse_ttl,
            from,
            out: Vec::new(),
            done: limit == 0,
        }
    }

    /// Whether the listing is complete: run no more pages.
    pub fn done(&self) -> bool {
        self.done
    }

    /// The key the next page starts after.
    pub fn from(&self) -> &[u8] {
        &self.from
    }

    /// The key every page ends before (`None`: the table's end).
    pub fn below(&self) -> Option<&[u8]> {
        self.below.as_deref()
    }

    /// The bytes every listed key ends with (empty: any).
    pub fn suffix(&self) -> &[u8] {
        &self.suffix
    }

    /// The states to ask for, as bits `1 << state`, with bit 4 (a state no store
    /// writes) so that such a row comes back to be named corrupt.
    pub fn mask(&self) -> i32 {
        self.filter.state_mask() | 1 << 4
    }

    /// The unknown TTL to judge by (µs).
    pub fn lapse_ttl(&self) -> i64 {
        self.lapse_ttl
    }

    /// How many rows the next page asks for.
    pub fn page(&self) -> i64 {
        let page = self.limit.saturating_sub(self.out.len()).clamp(1, PAGE);
        i64::try_from(page).unwrap_or(i64::MAX)
    }

    /// A page's rows, each with the now its statement read; a row that does not read
    /// fails the listing. Done once `limit` records are found or the page was short.
    pub fn take(
        &mut self,
        rows: impl IntoIterator<Item = (i64, StoredRecord)>,
    ) -> Result<(), StoreError> {
        let asked = usize::try_from(self.page()).unwrap_or(usize::MAX);
        let mut read = 0;
        for (now, row) in rows {
            read += 1;
            self.from.clone_from(&row.key);
            if let Some(record) = judge(row, now, self.lapse_ttl)? {
                if self.filter.matches(&record) {
                    self.out.push(record);
                    if self.out.len() >= self.limit {
                        self.done = true;
                        return Ok(());
                    }
                }
            }
        }
        self.done = read < asked;
        Ok(())
    }

    /// The records found, in key order.
    pub fn into_records(self) -> Vec<Record> {
        self.out
    }
}

/// What a removal whose one statement deleted the row before it was read answers: the
/// record, or, for a row that does not read, [`StoreError::Corrupt`] saying it is gone
/// all the same (so that an operator clearing a garbled record knows it was cleared).
pub fn removed(judged: Result<Option<Record>, StoreError>) -> Result<Option<Record>, StoreError> {
    judged.map_err(|e| match e {
        StoreError::Corrupt(why) => StoreError::Corrupt(format!("{why} (it was deleted)")),
        other => other,
    })
}

/// The mask (`1 << state`) a removal of a record in one of `states` binds.
pub fn removal_mask(states: &[RecordState]) -> i32 {
    states.iter().fold(0, |mask, s| mask | 1 << s.code())
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemcache::Fingerprint;

    fn row(client_key: &str, state: i64, expires_at: i64) -> (i64, StoredRecord) {
        let key = Key::new("POST /x", "t", client_key).unwrap();
        let stored = StoredRecord {
            key: key.as_bytes().to_vec(),
            fingerprint: Some(Fingerprint::of(b"r").to_bytes().to_vec()),
            state,
            token: 1,
            body: None,
            started_at: Some(1),
            settled_at: Some(2),
            expires_at,
            correlation_id: None,
        };
        (100, stored)
    }

    #[test]
    fn a_listing_pages_past_every_row_read_and_stops_when_full_or_short() {
        let filter = RecordFilter::new().state(RecordState::Completed);
        let mut listing = Listing::new(&filter, None, 2, 0);
        assert_eq!((listing.page(), listing.mask()), (2, 0b10100));
        listing.take([row("a", 2, 50), row("b", 1, 200)]).unwrap();
        assert!(!listing.done(), "a full page, nothing found: read on");
        assert!(listing.from().ends_with(b"b"));
        listing.take([row("c", 2, 200), row("d", 2, 200)]).unwrap();
        assert!(listing.done());
        let found: Vec<_> =
            listing.into_records().iter().map(|r| r.key.client_key().to_owned()).collect();
        assert_eq!(found, ["c", "d"]);
        let mut short = Listing::new(&RecordFilter::new(), None, 10, 0);
        short.take([row("a", 2, 200)]).unwrap();
        assert!(short.done());
        assert!(Listing::new(&RecordFilter::new(), None, 0, 0).done());
        let mut corrupt = Listing::new(&RecordFilter::new(), None, 10, 0);
        assert!(matches!(corrupt.take([row("a", 9, 200)]), Err(StoreError::Corrupt(_))));
        assert_eq!(removal_mask(&[RecordState::Processing, RecordState::Unknown]), 0b1010);
    }
}
