//! The inbox consuming redis, end to end (work in progress).
