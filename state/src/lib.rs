//! weir-state
