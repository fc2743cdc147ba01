-- Nexmark q14: calculation. Bids over $10,000 and under $500,000 in euros, by time of day, with
-- how many 'c's their extra field holds (Nexmark's count_char UDF, as an expression).
SELECT auction, bidder, 0.908 * price AS price,
       CASE
           WHEN extract(HOUR FROM date_time) >= 8 AND extract(HOUR FROM date_time) <= 18 THEN 'dayTime'
           WHEN extract(HOUR FROM date_time) <= 6 OR extract(HOUR FROM date_time) >= 20 THEN 'nightTime'
           ELSE 'otherTime'
       END AS bid_time_type,
       date_time, extra,
       length(extra) - length(replace(extra, 'c', '')) AS c_counts
FROM STREAM bid
WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000;
