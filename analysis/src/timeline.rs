//! The node timeline: declared series, raw samples and markers, and the queries attribution
//! asks of them.
