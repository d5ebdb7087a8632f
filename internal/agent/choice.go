package agent

// WhyDefault is the reason recorded with a lease whose addresses came from the
// network's own ranges, as no annotation chose otherwise.
const WhyDefault = "default pool"
