//! Batch IDs as log entries name them (`offsets/<N>`, a file sink's `_weir_metadata/<N>`): a
//! decimal number below 2^63, as Spark's `Long` batch IDs, so that `N + 1` and `N + 2` never
//! overflow.

/// The largest batch ID a log entry may have.
pub const MAX_BATCH_ID: u64 = i64::MAX as u64;

/// What a file name in a log folder says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryName {
    /// Not an entry: not all digits (a `.tmp` a crash left, an editor's backup).
    Other,
    /// The entry of this batch.
    Batch(u64),
    /// All digits, but no batch weir writes (2^63 or more): damage, refused by name.
    OutOfRange,
}

/// Reads a log entry's file name.
pub fn entry_name(name: &str) -> EntryName {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_digit()) {
        return EntryName::Other;
    }
    match name.parse::<u64>() {
        Ok(id) if id <= MAX_BATCH_ID => EntryName::Batch(id),
        _ => EntryName::OutOfRange,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_batches_below_2_63_or_other_files() {
        assert_eq!(entry_name("17"), EntryName::Batch(17));
        assert_eq!(
            entry_name("9223372036854775807"),
            EntryName::Batch(MAX_BATCH_ID)
        );
        assert_eq!(entry_name("9223372036854775808"), EntryName::OutOfRange);
        assert_eq!(entry_name("18446744073709551615"), EntryName::OutOfRange);
        assert_eq!(entry_name("99999999999999999999999"), EntryName::OutOfRange);
        assert_eq!(entry_name(".3.tmp"), EntryName::Other);
        assert_eq!(entry_name(""), EntryName::Other);
    }
}
