package broker

// LongPolls is how many keys (nodes' long polls, runs' follows) calls
// wait on now: a test waits for its call to be held before it acts.
func (b *Broker) LongPolls() int { return b.runs.waiting() }
