-- Nexmark q6: average selling price by seller. The average of each seller's last 10 closed
-- auctions' winning bids (top-1 per auction, then an OVER window of 10 rows per seller).
-- weir: outputMode=update
-- weir: unsupported: top-1 per key (row_number() ... <= 1) after a join, then a ROWS OVER window over its updates (Flink cannot run q6 either)
SELECT seller, avg(final) OVER (PARTITION BY seller ORDER BY date_time ROWS BETWEEN 10 PRECEDING AND CURRENT ROW) AS avg_price
FROM (
    SELECT *, row_number() OVER (PARTITION BY id ORDER BY final DESC, date_time ASC) AS rn
    FROM (
        SELECT a.id, a.seller, b.price AS final, b.date_time
        FROM STREAM auction WATERMARK date_time DELAY OF INTERVAL 4 SECONDS AS a
        JOIN STREAM bid WATERMARK date_time DELAY OF INTERVAL 4 SECONDS AS b
          ON a.id = b.auction AND b.date_time BETWEEN a.date_time AND a.expires
    ) winning
) ranked
WHERE rn <= 1;
