-- Nexmark q12: processing-time windows. Bids per bidder in 10-second windows of processing
-- time: `now()`, which in a streaming query is its batch's timestamp (recorded in the offsets
-- log, so a replayed batch gets the same one), as Spark's `current_timestamp()`; Feldera writes
-- q12 with `NOW()` too, Flink with `PROCTIME()`.
-- weir: outputMode=update
-- weir: compare: bidder, sum(bid_count) AS bids
-- weir: totalsBy: bidder
SELECT bidder, count(*) AS bid_count, window(p_time, '10 seconds') AS w
FROM (SELECT *, now() AS p_time FROM STREAM bid) b
GROUP BY bidder, window(p_time, '10 seconds');
