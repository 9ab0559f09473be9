//! The inbox consuming rabbitmq, end to end (work in progress).
