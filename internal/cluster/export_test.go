package cluster

import "time"

// SetReservationsPause sets rs's first pause after a break, before Run starts.
func SetReservationsPause(rs *Reservations, d time.Duration) { rs.pause0 = d }
