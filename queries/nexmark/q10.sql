-- Nexmark q10: log to the file system. Every bid with the day and minute it would be filed
-- under (Nexmark partitions its files by them: a Delta sink's partitionBy does that).
SELECT auction, bidder, price, date_time, extra,
       to_char(date_time, '%Y-%m-%d') AS dt, to_char(date_time, '%H:%M') AS hm
FROM STREAM bid;
