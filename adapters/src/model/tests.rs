//! Tests of the model transports.
