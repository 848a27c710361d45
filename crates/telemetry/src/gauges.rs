//! Gauges read when the metrics are collected (a scrape, an export), for figures that are
//! states rather than events: queue depths, calls in flight.

use opentelemetry::KeyValue;

/// Registers gauge `name` of the meter provider in place: at each collection `read` reports
/// every value with its attributes. A reader whose subject is gone reports nothing.
pub fn observe_gauge(
    name: &'static str,
    description: &'static str,
    read: impl Fn(&mut dyn FnMut(u64, &[KeyValue])) + Send + Sync + 'static,
) {
    // The callback stays with the provider; the handle is not needed to keep it.
    let _gauge = opentelemetry::global::meter("toolmesh")
        .u64_observable_gauge(name)
        .with_description(description)
        .with_callback(move |observer| {
            read(&mut |value, attributes| observer.observe(value, attributes))
        })
        .build();
}
