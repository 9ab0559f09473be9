//! The inbox consuming kafka, end to end (work in progress).
