-- Nexmark q17: auction statistics per day. Bids per auction and day in three price ranges, and
-- the lowest, highest, mean and total price.
-- weir: outputMode=update
SELECT auction,
       CAST(date_time AS DATE) AS day,
       count(*) AS total_bids,
       count(*) FILTER (WHERE price < 10000) AS rank1_bids,
       count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids,
       count(*) FILTER (WHERE price >= 1000000) AS rank3_bids,
       min(price) AS min_price,
       max(price) AS max_price,
       avg(price) AS avg_price,
       sum(price) AS sum_price
FROM STREAM bid
GROUP BY auction, CAST(date_time AS DATE);
