-- Nexmark q5 as batch SQL: each bid counts in the five 10-second windows, starting every 2
-- seconds, that hold it (DataFusion's window() is a tumbling window in batch SQL).
WITH counts AS (
    SELECT auction, date_bin(INTERVAL '2 seconds', date_time) - back AS starttime, count(*) AS num
    FROM bid
    CROSS JOIN (VALUES (INTERVAL '0 seconds'), (INTERVAL '2 seconds'), (INTERVAL '4 seconds'),
                       (INTERVAL '6 seconds'), (INTERVAL '8 seconds')) AS hops(back)
    GROUP BY auction, date_bin(INTERVAL '2 seconds', date_time) - back
)
SELECT c.auction, c.num, c.starttime
FROM counts c
JOIN (SELECT starttime, max(num) AS maxn FROM counts GROUP BY starttime) m
  ON c.starttime = m.starttime AND c.num >= m.maxn;
