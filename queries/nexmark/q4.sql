-- Nexmark q4: average price per category. The winning (highest) bid of each auction, among the
-- bids placed while it was open, averaged per category.
-- weir: outputMode=update
SELECT q.category, avg(q.final) AS avg_price
FROM (
    SELECT max(b.price) AS final, a.category
    FROM STREAM auction WATERMARK date_time DELAY OF INTERVAL 4 SECONDS AS a
    JOIN STREAM bid WATERMARK date_time DELAY OF INTERVAL 4 SECONDS AS b
      ON a.id = b.auction AND b.date_time BETWEEN a.date_time AND a.expires
    GROUP BY a.id, a.category
) q
GROUP BY q.category;
