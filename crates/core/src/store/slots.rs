//! The memory of a table's slots: an anonymous memory map of its own, not the allocator's heap.
//!
//! Written by hand for a measured reason: a table doubles as buckets arrive, and the allocator
//! (mimalloc) kept the outgrown tables' pages resident — a node holding a million buckets had
//! far more RSS than its tables needed, and still well over it with mimalloc purging at once
//! (measured: the docs' benchmarks page, "Resident bytes per bucket"). A map of its own goes
//! back to the OS (`munmap`) the moment the table has moved to its larger one, so a node's RSS
//! is the tables in use, and the peak while filling exceeds it by one shard's outgrown table at
//! most.

use memmap2::MmapMut;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// `len` values of `T` in a memory map of their own.
pub(super) struct Slots<T> {
    ptr: NonNull<T>,
    len: usize,
    /// Owns the memory `ptr` points into; unmapped when dropped (after the values).
    _map: MmapMut,
}

// SAFETY: `Slots<T>` owns its `T`s like a `Box<[T]>` does (no sharing, no interior
// mutability of its own), so it may cross threads when `T` may.
unsafe impl<T: Send> Send for Slots<T> {}
// SAFETY: as above: `&Slots<T>` hands out only `&[T]`.
unsafe impl<T: Sync> Sync for Slots<T> {}

impl<T: Clone> Slots<T> {
    /// `len` (at least 1) copies of `value`. Panics when the OS refuses the memory, as a
    /// `Vec` of that size would abort.
    pub fn new(len: usize, value: T) -> Self {
        let len = len.max(1);
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .expect("table size overflows");
        let mut map = MmapMut::map_anon(bytes.max(1))
            .unwrap_or_else(|e| panic!("cannot map {bytes} bytes for a bucket table: {e}"));
        let base = map.as_mut_ptr().cast::<T>();
        assert!(
            base.align_offset(std::mem::align_of::<T>()) == 0,
            "a memory map is page-aligned"
        );
        for i in 0..len {
            // SAFETY: `base` is valid for `len` writes of `T` (the map is `len * size_of::<T>()`
            // bytes, aligned as checked), and each slot is written once before any is read.
            unsafe { base.add(i).write(value.clone()) };
        }
        Self {
            // A map's address is never null.
            ptr: NonNull::new(base).expect("a memory map is never at address 0"),
            len,
            _map: map,
        }
    }
}

impl<T> Deref for Slots<T> {
    type Target = [T];

    #[inline]
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` points at `len` initialised `T`s inside `_map`, which lives as long as
        // `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> DerefMut for Slots<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Drop for Slots<T> {
    fn drop(&mut self) {
        // SAFETY: the values are initialised and dropped once, here, before `_map` unmaps
        // their memory (fields drop after this body).
        unsafe {
            std::ptr::drop_in_place(std::ptr::slice_from_raw_parts_mut(
                self.ptr.as_ptr(),
                self.len,
            ))
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn holds_its_values_and_drops_each_once() {
        let counted = Arc::new(());
        let mut s = Slots::new(1000, Some(counted.clone()));
        assert_eq!(s.len(), 1000);
        assert_eq!(Arc::strong_count(&counted), 1001);
        s[999] = None;
        s[0] = None;
        assert_eq!(Arc::strong_count(&counted), 999);
        drop(s);
        assert_eq!(Arc::strong_count(&counted), 1);
    }

    #[test]
    fn an_empty_request_still_gives_one_slot() {
        let s = Slots::new(0, 7u64);
        assert_eq!(&s[..], &[7]);
    }
}
