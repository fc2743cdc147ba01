-- Nexmark q12: processing-time windows. Bids per bidder in 10-second windows of processing
-- time (the wall clock when weir read the bid), not event time.
-- weir: unsupported: processing-time windows
SELECT bidder, count(*) AS bid_count, window(proctime(), '10 seconds') AS w
FROM STREAM bid
GROUP BY bidder, window(proctime(), '10 seconds');
