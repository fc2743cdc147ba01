-- Nexmark q7: highest bid. The bids with the highest price of each 10-second window.
-- weir: final: date_bin(INTERVAL '10 seconds', date_time) + INTERVAL '10 seconds' <= :watermark
SELECT b.auction, b.price, b.bidder, b.date_time, b.extra
FROM STREAM bid WATERMARK date_time DELAY OF INTERVAL 4 SECONDS AS b
JOIN (
    SELECT max(price) AS maxprice, window(date_time, '10 seconds')['end'] AS date_time
    FROM STREAM bid WATERMARK date_time DELAY OF INTERVAL 4 SECONDS
    GROUP BY window(date_time, '10 seconds')
) b1
  ON b.price = b1.maxprice
 AND b.date_time BETWEEN b1.date_time - INTERVAL 10 SECONDS AND b1.date_time;
