//! weir-engine
