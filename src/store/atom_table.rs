//! The index's atom entries by id, in pages allocated on first use: memory follows the atoms a
//! store holds, not the largest id it has seen. A long gap of ids (a dropped run whose records
//! compaction removed, or a damaged but checksum-valid record naming atom four billion) costs
//! one empty page slot per `PAGE_ATOMS` ids instead of 32 bytes per id.

use crate::store::index::AtomEntry;

/// Entries per page (128 KiB of 32-byte entries).
pub(crate) const PAGE_ATOMS: usize = 4096;

/// Atom entries indexed from 0 (atom `n` is at `n - 1`), `len` of them; entries of pages never
/// written read as vacant.
#[derive(Clone, Debug, Default)]
pub(crate) struct AtomTable {
    pages: Vec<Option<Box<[AtomEntry]>>>,
    len: usize,
}

impl AtomTable {
    /// How many entries the table spans (the largest id it has room for).
    pub fn len(&self) -> usize {
        self.len
    }

    /// The entry at `at`, if the table spans it (vacant if its page was never written).
    pub fn get(&self, at: usize) -> Option<&AtomEntry> {
        if at >= self.len {
            return None;
        }
        match self.pages.get(at / PAGE_ATOMS)? {
            Some(page) => page.get(at % PAGE_ATOMS),
            None => Some(&AtomEntry::VACANT),
        }
    }

    /// The entry at `at`, mutably, if its page exists (an unwritten page holds only vacant
    /// entries, which callers never change without [`AtomTable::slot`]).
    pub fn get_mut(&mut self, at: usize) -> Option<&mut AtomEntry> {
        if at >= self.len {
            return None;
        }
        self.pages.get_mut(at / PAGE_ATOMS)?.as_mut()?.get_mut(at % PAGE_ATOMS)
    }

    /// The entry at `at`, spanning the table to it and allocating its page if needed.
    pub fn slot(&mut self, at: usize) -> &mut AtomEntry {
        self.extend_to(at + 1);
        let page =
            self.pages[at / PAGE_ATOMS].get_or_insert_with(|| vec![AtomEntry::VACANT; PAGE_ATOMS].into_boxed_slice());
        &mut page[at % PAGE_ATOMS]
    }

    /// Spans the table to `len` entries (never shrinks); new entries are vacant and take no
    /// page until written.
    pub fn extend_to(&mut self, len: usize) {
        if len > self.len {
            self.len = len;
            self.pages.resize_with(len.div_ceil(PAGE_ATOMS), || None);
        }
    }

    /// `(index, entry)` of every entry in a written page, in index order (unwritten pages hold
    /// only vacant entries).
    pub fn iter(&self) -> impl Iterator<Item = (usize, &AtomEntry)> {
        self.iter_from(0)
    }

    /// [`AtomTable::iter`] from entry `at` on.
    pub fn iter_from(&self, at: usize) -> impl Iterator<Item = (usize, &AtomEntry)> {
        let len = self.len;
        let first_page = at / PAGE_ATOMS;
        self.pages
            .iter()
            .enumerate()
            .skip(first_page)
            .filter_map(|(p, page)| Some((p, page.as_ref()?)))
            .flat_map(move |(p, page)| {
                page.iter()
                    .enumerate()
                    .map(move |(i, entry)| (p * PAGE_ATOMS + i, entry))
                    .filter(move |(i, _)| *i < len)
            })
            .skip_while(move |(i, _)| *i < at)
    }

    /// [`AtomTable::iter_from`], mutably.
    pub fn iter_mut_from(&mut self, at: usize) -> impl Iterator<Item = (usize, &mut AtomEntry)> {
        let len = self.len;
        let first_page = at / PAGE_ATOMS;
        self.pages
            .iter_mut()
            .enumerate()
            .skip(first_page)
            .filter_map(|(p, page)| Some((p, page.as_mut()?)))
            .flat_map(move |(p, page)| {
                page.iter_mut()
                    .enumerate()
                    .map(move |(i, entry)| (p * PAGE_ATOMS + i, entry))
                    .filter(move |(i, _)| *i < len)
            })
            .skip_while(move |(i, _)| *i < at)
    }

    /// Every written page: its number and entries (entry `i` of page `p` is at
    /// `p * PAGE_ATOMS + i`), in order.
    pub fn written_pages(&self) -> impl Iterator<Item = (usize, &[AtomEntry])> {
        self.pages.iter().enumerate().filter_map(|(p, page)| Some((p, page.as_deref()?)))
    }

    /// Replaces page `page` with `entries` (exactly `PAGE_ATOMS` of them), spanning the table
    /// to at least the page's end if `len` is not larger; `None` if the page lies past `len`.
    pub fn put_page(&mut self, page: usize, entries: Box<[AtomEntry]>) -> Option<()> {
        if entries.len() != PAGE_ATOMS || page >= self.len.div_ceil(PAGE_ATOMS) {
            return None;
        }
        self.pages[page] = Some(entries);
        Some(())
    }

    /// Frees every written page holding entries `from..to` that holds only vacant entries
    /// (the atoms of a dropped run, say): it reads as vacant, as before, and takes no memory.
    /// Returns the pages freed.
    pub fn release_vacant_pages(&mut self, from: usize, to: usize) -> usize {
        let last_page = to.min(self.len).div_ceil(PAGE_ATOMS);
        let mut freed = 0;
        for page in self.pages.iter_mut().take(last_page).skip(from / PAGE_ATOMS) {
            if page.as_ref().is_some_and(|entries| entries.iter().all(|entry| *entry == AtomEntry::VACANT)) {
                *page = None;
                freed += 1;
            }
        }
        freed
    }

    /// Drops the spare capacity of the page list.
    pub fn shrink_to_fit(&mut self) {
        self.pages.shrink_to_fit();
    }

    /// Heap bytes held: written pages and the page list.
    pub fn heap_bytes(&self) -> usize {
        let written = self.pages.iter().filter(|page| page.is_some()).count();
        written * PAGE_ATOMS * std::mem::size_of::<AtomEntry>()
            + self.pages.capacity() * std::mem::size_of::<Option<Box<[AtomEntry]>>>()
    }
}

/// Equal when they span the same ids with the same entries (a page never written equals one
/// written back to vacant).
impl PartialEq for AtomTable {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && (0..self.pages.len()).all(|p| page_entries(self, p) == page_entries(other, p))
    }
}

fn page_entries(table: &AtomTable, page: usize) -> Vec<AtomEntry> {
    match table.pages.get(page) {
        Some(Some(entries)) => entries.to_vec(),
        _ => vec![AtomEntry::VACANT; PAGE_ATOMS],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::index::EntryState;

    #[test]
    fn a_far_id_costs_a_page_not_the_gap() {
        let mut table = AtomTable::default();
        table.slot(3).state = EntryState::Running;
        let far = u32::MAX as usize - 1;
        table.slot(far).state = EntryState::Completed;
        assert_eq!(table.len(), far + 1);
        assert!(table.heap_bytes() < 64 << 20, "{} bytes", table.heap_bytes());
        assert_eq!(table.get(far).map(|e| e.state), Some(EntryState::Completed));
        assert_eq!(table.get(far - 1).map(|e| e.state), Some(EntryState::Vacant));
        assert_eq!(table.get(far + 1), None);
        assert!(table.get_mut(1 << 20).is_none());
        let written: Vec<usize> =
            table.iter().filter(|(_, e)| e.state != EntryState::Vacant).map(|(at, _)| at).collect();
        assert_eq!(written, [3, far]);
    }

    #[test]
    fn iteration_from_an_entry_skips_the_pages_before_it() {
        let mut table = AtomTable::default();
        for at in [2, 4_100, 9_000, 50_000] {
            table.slot(at).state = EntryState::Running;
        }
        let from = |at| -> Vec<usize> {
            table.iter_from(at).filter(|(_, e)| e.state != EntryState::Vacant).map(|(i, _)| i).collect()
        };
        assert_eq!(from(0), [2, 4_100, 9_000, 50_000]);
        assert_eq!(from(3), [4_100, 9_000, 50_000]);
        assert_eq!(from(4_100), [4_100, 9_000, 50_000]);
        assert_eq!(from(9_001), [50_000]);
        assert_eq!(from(50_001), Vec::<usize>::new());
        assert_eq!(table.iter_from(4_097).next().map(|(i, _)| i), Some(4_097));
    }

    #[test]
    fn pages_left_vacant_are_freed_and_still_read_as_vacant() {
        let mut table = AtomTable::default();
        for at in [10, PAGE_ATOMS + 10, 2 * PAGE_ATOMS + 10] {
            table.slot(at).state = EntryState::Completed;
        }
        let before = table.heap_bytes();
        // The first two pages' atoms are vacated (their run dropped); the third keeps its.
        let first = table.slot(10);
        (first.state, first.run) = (EntryState::Vacant, 7);
        *table.slot(PAGE_ATOMS + 10) = AtomEntry::VACANT;
        assert_eq!(table.release_vacant_pages(0, 3 * PAGE_ATOMS), 1, "the first page still holds a non-vacant field");
        *table.slot(10) = AtomEntry::VACANT;
        assert_eq!(table.release_vacant_pages(0, 2 * PAGE_ATOMS), 1, "only pages in the range");
        assert_eq!(table.heap_bytes(), before - 2 * PAGE_ATOMS * std::mem::size_of::<AtomEntry>());
        assert_eq!(table.get(10), Some(&AtomEntry::VACANT));
        assert!(table.get_mut(PAGE_ATOMS + 10).is_none(), "a freed page is not written");
        assert_eq!(table.get(2 * PAGE_ATOMS + 10).map(|e| e.state), Some(EntryState::Completed));
        assert_eq!(table.release_vacant_pages(0, usize::MAX), 0);
    }

    #[test]
    fn iteration_stops_at_the_span_and_equality_ignores_unwritten_pages() {
        let mut a = AtomTable::default();
        a.slot(5).state = EntryState::Running;
        assert_eq!(a.iter().count(), 6, "the written page, up to the span");
        a.extend_to(10_000);
        assert_eq!(a.iter().count(), PAGE_ATOMS, "only the written page");
        let mut b = a.clone();
        b.slot(9_000).state = EntryState::Running;
        assert!(a != b);
        b.slot(9_000).state = EntryState::Vacant;
        assert!(a == b);
        for (_, entry) in b.iter_mut_from(0) {
            entry.pinned = false;
        }
        assert!(a == b);
    }
}
